"""The pitfall guards' pure parts: UUID spellings, a changed CUDA_VISIBLE_DEVICES, GPUs nobody assigned."""

from __future__ import annotations

from ddpboot.worker.guards import any_mig, normalize_uuid, unassigned_gpus, visible_devices_changed

UUID_A = "GPU-8c3f2b1a-0000-1111-2222-333344445555"
UUID_B = "GPU-9d4e3c2b-6666-7777-8888-99990000aaaa"


def test_uuid_spellings() -> None:
    # torch prints props.uuid without NVML's prefix
    assert normalize_uuid(UUID_A) == normalize_uuid(UUID_A[4:]) == normalize_uuid(UUID_A.upper())


def test_visible_devices_changed() -> None:
    assert visible_devices_changed(UUID_A, [UUID_A]) is None
    assert visible_devices_changed(f" {UUID_A.lower()} ", [UUID_A]) is None
    assert visible_devices_changed("0", []) is None  # CPU rank: nothing assigned, nothing to compare
    msg = visible_devices_changed("0", [UUID_A])
    assert msg is not None and "CUDA_VISIBLE_DEVICES is '0'" in msg and UUID_A in msg and "Fix:" in msg
    unset = visible_devices_changed(None, [UUID_A])
    assert unset is not None and "is unset" in unset
    assert visible_devices_changed(f"{UUID_B},{UUID_A}", [UUID_A, UUID_B]) is not None  # order is CUDA's numbering


def test_unassigned_gpus_compares_across_spellings() -> None:
    assert unassigned_gpus([UUID_A[4:]], [UUID_A]) == ()
    assert unassigned_gpus([UUID_A, UUID_B], [UUID_A]) == (UUID_B,)


def test_mig_instances_are_recognised() -> None:
    assert any_mig([UUID_A, " mig-1234"]) and not any_mig([UUID_A])
