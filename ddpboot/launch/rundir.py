"""The run directory, where a run's files go: BASE/RUN_ID with --log-dir (BASE's disk checked for room before
anything is made there), or a fresh temporary directory; its layout, named here only (`RunPaths`, `AttemptPaths`);
and its first file, plan.json, written before anything starts.

Who may read them (LogMode, `--log-mode`): by default only the job's owner. On a machine several people log into,
a rank's output, its @record traceback and its exit mark can show data paths, hyperparameters or secrets. The run
directory (--log-dir BASE/RUN_ID) and every attempt_N directory are made 0700 and the launcher's log files 0600;
the files the ranks themselves write there (TORCHELASTIC_ERROR_FILE through torch's @record, and the exit mark
beside it) get the ranks' umask, and the 0700 directories above them are what keeps other users out. BASE itself
keeps its mode: it may be a directory the user shares on purpose (a team's log directory).

Without --log-dir, -r/-t still write files, as torchrun's do (it writes them under a fresh `torchelastic_*` temporary
directory and leaves it behind, unnamed): BASE is then the user's own `$TMPDIR/ddpboot-logs-UID` (temporary_log_base),
kept after the run and named on the console like any run directory. It is made 0700 and must stay the user's and
writable by no one else: a directory of that name that another user made first is refused, not written into.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ddpboot.errors import UsageError
from ddpboot.launch.logs import why_not_written
from ddpboot.launch.spec import LogMode, RunDir


@dataclass(frozen=True)
class AttemptPaths:
    """One attempt's directory, RUN/attempt_N: per rank G, `rankG.log` (its output with --log-dir and -r/-t),
    `rankG.error.json` (its TORCHELASTIC_ERROR_FILE, written by torch's @record) and beside it what the rank
    itself writes, named from that file (contract.py: `rankG.error.json.exiting`, the exit mark, and `rankG.stacks`,
    its faulthandler's stacks); and NCCL's flight recorder dumps (the ranks' trace directory)."""

    root: Path

    def log(self, rank: int) -> Path:
        return self.root / f"rank{rank}.log"

    def error_file(self, rank: int) -> Path:
        return self.root / f"rank{rank}{ERROR_SUFFIX}"


ERROR_SUFFIX = ".error.json"
_RANK_ERROR_FILE = re.compile(rf"rank(\d+){re.escape(ERROR_SUFFIX)}$")


def rank_of_error_file(path: str) -> int | None:
    """The rank whose error file (AttemptPaths.error_file) `path` is, or None for another file."""
    m = _RANK_ERROR_FILE.search(path)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RunPaths:
    """One launcher's run directory (BASE/RUN_ID, an elastic job's BASE/RUN_ID/round_R, or a temporary directory):

        plan.json                    the plan, written before anything starts (`write_first`)
        launcher.json                the launcher's record while it runs (stacks/find.py)
        status.json                  what `ddpboot top` reads while it runs (observe/status.py)
        stacks-N.txt, stacks-N.json  the N-th stack dump (stacks/dump.py)
        attempt_N/                   attempt N (AttemptPaths)
        round_R/                     an elastic job's round R, a run directory of its own
    """

    root: Path

    PLAN = "plan.json"
    RECORD = "launcher.json"
    STATUS = "status.json"

    @property
    def plan(self) -> Path:
        return self.root / self.PLAN

    @property
    def record(self) -> Path:
        return self.root / self.RECORD

    @property
    def status(self) -> Path:
        return self.root / self.STATUS

    def attempt(self, n: int) -> AttemptPaths:
        return AttemptPaths(self.root / f"attempt_{n}")

    def round(self, label: int) -> RunPaths:
        return RunPaths(self.root / f"round_{label}")

    def dumps(self) -> set[Path]:
        """The stack dumps' JSON files written so far."""
        return set(self.root.glob("stacks-*.json"))

    def next_dump(self) -> tuple[Path, Path]:
        """The next stacks-N.txt and stacks-N.json."""
        n = 1
        while (self.root / f"stacks-{n}.json").exists() or (self.root / f"stacks-{n}.txt").exists():
            n += 1
        return self.root / f"stacks-{n}.txt", self.root / f"stacks-{n}.json"

    @classmethod
    def of_stacks_file(cls, path: Path) -> RunPaths:
        """The run directory of a rank's stacks file (RUN/attempt_N/rankG.stacks)."""
        return cls(path.parent.parent)


def write_whole(path: Path, text: str) -> None:
    """Write `text` beside `path` and rename it into place: whoever looks for the file (`ddpboot stacks`, awaiting
    a record or a dump, `ddpboot top`) finds it absent or whole, never empty or cut."""
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        partial.write_text(text, encoding="utf-8")
        os.replace(partial, path)
    except OSError:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def temporary_log_base() -> Path:
    """Where -r/-t write without --log-dir: the user's own directory in the temporary directory (module docstring)."""
    return Path(tempfile.gettempdir()) / f"ddpboot-logs-{os.getuid()}"


def _own_base(base: Path) -> None:
    """The temporary log base exists as a real directory of this user's that no one else can write into."""
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(base, 0o700)
        st = os.lstat(base)
    except OSError as exc:
        raise UsageError(f"-r/--redirects and -t/--tee without --log-dir write under {base}, which cannot be made "
                         f"({exc.strerror}). Give --log-dir DIR.") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise UsageError(
            f"-r/--redirects and -t/--tee without --log-dir write under {base}, but that is not a directory of yours "
            "that only you can write (another user may have made it). Give --log-dir DIR, or remove it."
        )


MIN_FREE = 64 * 1024  # bytes: a log disk with less free is full already (the first lines would not fit)


def _check_room(base: Path) -> None:
    """Refuse a --log-dir on a full disk before anything is made there: the free space of the nearest directory that
    exists (what root may use, reserved blocks included, for root)."""
    existing = next((p for p in [base, *base.parents] if p.is_dir()), None)
    if existing is None:
        return
    try:
        st = os.statvfs(existing)
    except OSError:
        return
    free = (st.f_bfree if os.geteuid() == 0 else st.f_bavail) * st.f_frsize
    if free < MIN_FREE:
        raise UsageError(f"--log-dir {base}: its disk is full ({free // 1024} KiB free at {existing}). Free space "
                         "there, or give --log-dir a directory on another disk.")


def job_dir(log_dir: Path | None, run_id: str, mode: LogMode) -> RunDir:
    """A job's run directory, the same for a static job and the rounds of an elastic one: DIR/RUN_ID with --log-dir
    (`run_dir`), else a fresh temporary one (`temporary_run_dir`)."""
    if log_dir is not None:
        return RunDir(run_dir(log_dir, run_id, mode), False)
    return RunDir(temporary_run_dir(), True)


def temporary_run_dir() -> Path:
    """The run directory without --log-dir: a fresh 0700 directory in the temporary directory, removed at the end
    (by the supervisor, and by the runner should it never start)."""
    try:
        return Path(tempfile.mkdtemp(prefix="ddpboot-"))
    except OSError as exc:
        raise UsageError(f"cannot make the run's directory in the temporary directory {tempfile.gettempdir()}: "
                         f"{why_not_written(exc)}. Free space there, or set TMPDIR to a directory with room.") from None


def write_first(where: Path, temporary: bool, text: str) -> None:
    """The run directory's first file (plan.json), written before anything starts: a directory that cannot take it
    (a full disk) is an error now, and the directory made for it is removed, rather than a job that fails later."""
    path = RunPaths(where).plan
    try:
        write_whole(path, text)
    except OSError as exc:
        shutil.rmtree(where, ignore_errors=True)
        what = "set TMPDIR to a directory with room" if temporary else "give --log-dir a directory on another disk"
        raise UsageError(f"cannot write {path}: {why_not_written(exc)}. Nothing was started. Free space "
                         f"there, or {what}.") from None


def run_dir(base: Path, run_id: str, mode: LogMode = LogMode.PRIVATE) -> Path:
    """BASE/RUN_ID, or BASE/RUN_ID.N when an earlier run used that id: logs are never overwritten. BASE keeps the
    mode it has (or gets the umask's when created); RUN_ID gets `mode`'s. The temporary log base (-r/-t without
    --log-dir) is checked to be the user's own first."""
    if base == temporary_log_base():
        _own_base(base)
    _check_room(base)
    try:
        base.mkdir(parents=True, exist_ok=True)
        for n in range(10000):
            path = base / (run_id if n == 0 else f"{run_id}.{n}")
            try:
                mode.make_dir(path)
                return path
            except FileExistsError:
                continue
    except OSError as exc:
        raise UsageError(
            f"--log-dir {base}: cannot create it ({exc.strerror}); give a directory you can write."
        ) from None
    raise UsageError(f"--log-dir {base}: {run_id} and 9999 numbered variants exist; choose another --rdzv-id.")
