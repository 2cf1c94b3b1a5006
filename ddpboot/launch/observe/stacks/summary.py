"""Stack texts (py-spy's `dump` or faulthandler's) → frames → the one line per rank a person reads first. Pure.

The relevant frame is the innermost call into torch.distributed that waits for peers: a collective, a barrier,
point-to-point, the process group's creation (the rendezvous waits on the store) or its destruction. The thread
shown is the main thread (py-spy names it; in faulthandler's text it is the one that runs `<module>`) unless only
another thread waits in torch.distributed. A call that runs in C++ shows no frame of its own (`work.wait()`, or a
process group's destructor while `destroy_process_group()` returns): when the innermost frame is the script's, its
source line (read through `source`) names the call.

An NCCL collective returns as soon as its kernel is queued; a rank whose peer never joins it then waits wherever
the host next waits for the GPU: `torch.cuda.synchronize()`, or `.item()`, `.cpu()`, `.tolist()` in the script
(measured with two single-GPU nodes on NCCL's socket transport: rank 0 stuck in `torch.cuda.synchronize()` after an
`all_reduce` its peer left). Such a frame is named as a wait for the GPU, with the collective the same source line
calls when it calls one.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

WAITS = frozenset({
    "all_reduce", "all_reduce_coalesced", "all_gather", "all_gather_into_tensor", "all_gather_object",
    "all_gather_coalesced", "reduce", "reduce_scatter", "reduce_scatter_tensor", "broadcast", "broadcast_object_list",
    "scatter", "scatter_object_list", "gather", "gather_object", "all_to_all", "all_to_all_single", "barrier",
    "monitored_barrier", "send", "recv", "send_object_list", "recv_object_list", "batch_isend_irecv",
    "destroy_process_group", "init_process_group", "new_group", "_store_based_barrier", "rendezvous",
    "_create_c10d_store", "_env_rendezvous_handler",
})
"""torch.distributed functions that wait for the other ranks."""
GPU_WAITS = frozenset({"synchronize", "item", "cpu", "tolist"})
"""Calls in which the host waits for the GPU (torch.cuda's or a stream's or event's `synchronize`, a tensor's
`.item()`, `.cpu()`, `.tolist()`)."""
STORE_WAITS = frozenset({"_store_based_barrier", "rendezvous", "_create_c10d_store", "_env_rendezvous_handler"})
"""... of which those that wait on the store (shown as `init_process_group (waiting on the store)`)."""

_LIBRARY_DIRS = ("/torch/", "/site-packages/", "/dist-packages/", "/ddpboot/", "/lib/python3")
_PYSPY_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?::\s*"(.*)")?')
_PYSPY_FRAME = re.compile(r"^\s{4}(\S.*?) \((.+?)(?::(\d+))?\)\s*$")
_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.+?)\s*$')
_CALL = re.compile(r"\b(\w+)\s*\(")
Source = Callable[[str, int], str]  # (file, line) -> that line's text, "" when unknown


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int | None = None

    @property
    def is_distributed(self) -> bool:
        return "torch/distributed/" in self.file

    @property
    def is_user(self) -> bool:
        path = "/" + self.file.lstrip("/")
        return not any(d in path for d in _LIBRARY_DIRS) and not self.file.startswith(("<", "torch/"))

    def where(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line}" if self.line is not None else self.file


@dataclass
class Thread:
    name: str
    frames: list[Frame]  # innermost first
    main: bool = False


def parse(text: str) -> list[Thread]:
    """The threads of one process's stack text, py-spy's or faulthandler's; innermost frame first in each."""
    threads: list[Thread] = []
    for line in text.splitlines():
        m = _PYSPY_THREAD.match(line)
        if m:
            threads.append(Thread(m.group(3) or m.group(1), [], main=m.group(3) == "MainThread"))
            continue
        m = _FH_THREAD.match(line)
        if m:
            threads.append(Thread(m.group(2), []))
            continue
        if not threads:
            continue
        m = _FH_FRAME.match(line)
        if m:
            threads[-1].frames.append(Frame(m.group(3), m.group(1), int(m.group(2))))
            continue
        m = _PYSPY_FRAME.match(line)
        if m:
            threads[-1].frames.append(Frame(m.group(1), m.group(2), int(m.group(3)) if m.group(3) else None))
    if threads and not any(t.main for t in threads):
        for t in threads:
            t.main = any(f.function == "<module>" for f in t.frames)
    return threads


_LAUNCH_FUNCTIONS = frozenset({"<module>", "<lambda>"})
_LAUNCH_FILES = ("/launch/pymain.py", "/launch/faststart/forked.py", "/launch/faststart/zygote.py",
                 "/launch/faststart/warmserver.py")


def _is_launch_frame(frame: Frame) -> bool:
    """A frame of what started the script: the rank bootstrap's (`<string>`, launch/bootstrap.py), launch/pymain.py's
    (how an exec'd or forked rank runs its script) or the fast-start and warm processes' that forked the rank."""
    if frame.file == "<string>":
        return frame.function in _LAUNCH_FUNCTIONS
    return frame.file.endswith(_LAUNCH_FILES)


def without_launch_frames(text: str) -> str:
    """The stack text without the frames below the script's that ddpboot's start of the rank adds: in each thread,
    from the outermost frame in, the bootstrap's or the fast-start process's frames and the runpy frames between
    them, up to the innermost such frame of ddpboot's (runpy's frames above it are python's own under `-m`). A rank's
    stack then reads as under plain python; a thread with nothing else keeps its frames."""
    lines = text.splitlines()
    drop: set[int] = set()
    frames: list[tuple[int, Frame]] = []  # the current thread's frames, innermost first, with their lines
    for i, line in enumerate([*lines, ""]):
        if _PYSPY_THREAD.match(line) or _FH_THREAD.match(line) or not line.strip():
            drop.update(_launch_tail(frames))
            frames = []
            continue
        m = _FH_FRAME.match(line) or _PYSPY_FRAME.match(line)
        if m is not None:
            frames.append((i, Frame(m.group(3), m.group(1)) if m.re is _FH_FRAME else Frame(m.group(1), m.group(2))))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)


def _launch_tail(frames: list[tuple[int, Frame]]) -> list[int]:
    """The lines of the frames without_launch_frames drops from one thread."""
    k = len(frames)
    while k > 0 and (_is_launch_frame(frames[k - 1][1]) or "runpy" in frames[k - 1][1].file):
        k -= 1
    inner = next((j for j in range(k, len(frames)) if _is_launch_frame(frames[j][1])), None)
    return [i for i, _ in frames[inner:]] if inner else []


def main_frames(threads: list[Thread]) -> tuple[Frame, ...]:
    """The main thread's frames (every thread's when none is known to be the main one)."""
    main = [t for t in threads if t.main] or threads
    return tuple(f for t in main for f in t.frames)


def waiting_frame(thread: Thread) -> Frame | None:
    """The innermost torch.distributed frame of a function that waits for peers."""
    return next((f for f in thread.frames if f.is_distributed and f.function in WAITS), None)


@dataclass(frozen=True)
class Wait:
    """Where one rank is, as the verdict (verdict.py) groups ranks: what it waits in and the script's line there.

    kind: `collective`, `barrier`, `p2p` (send, recv), `store` (init_process_group waiting on the store), `init`
    (init_process_group, new_group), `destroy` (destroy_process_group), `work` (a collective's `.wait()`), `gpu`
    (the host waits for the GPU), `elsewhere` (in no torch.distributed call), `none` (no Python frames)."""

    kind: str
    what: str  # all_reduce, destroy_process_group, synchronize, ... ("" for elsewhere and none)
    at: str  # the script's line, `train.py:88` ("" when no frame of the script's is known)
    function: str  # the script's function at that line
    text: str  # the summary line (describe)
    after: str = ""  # a wait for the GPU: the collective on the same line ("" when none)

    @property
    def in_distributed(self) -> bool:
        return self.kind not in ("elsewhere", "none")


_KINDS = {"destroy_process_group": "destroy", "init_process_group": "init", "new_group": "init", "barrier": "barrier",
          "monitored_barrier": "barrier", "send": "p2p", "recv": "p2p", "send_object_list": "p2p",
          "recv_object_list": "p2p", "batch_isend_irecv": "p2p", "wait": "work"}


def _kind(function: str) -> str:
    return "store" if function in STORE_WAITS else _KINDS.get(function, "collective")


def describe(threads: list[Thread], source: Source | None = None, *, gpu: bool = True) -> str:
    """`all_reduce, called from train.py:14 in step`; or, waiting in nothing known, the main thread's innermost
    frame (and the torch.distributed call its source line makes); `no Python frames` when the text had none.
    `gpu`: whether the rank has a GPU; a CPU rank's `.item()` or `.cpu()` waits for no GPU, so only its
    collectives are read from the line."""
    return classify(threads, source, gpu=gpu).text


def classify(threads: list[Thread], source: Source | None = None, *, gpu: bool = True) -> Wait:
    """describe()'s answer with its parts (see Wait)."""
    ordered = sorted(threads, key=lambda t: not t.main)
    for t in ordered:
        frame = waiting_frame(t)
        if frame is not None:
            what = frame.function
            shown = "init_process_group (waiting on the store)" if what in STORE_WAITS else what
            user = _user_below(t, frame)
            return Wait(_kind(what), shown, user.where() if user else "", user.function if user else "",
                        shown + (f", called from {user.where()} in {user.function}" if user else ""))
    for t in ordered:
        if t.frames:
            inner = t.frames[0]
            waiting = _gpu_wait(t, source if gpu else None)
            if waiting is not None:
                return waiting
            called = _called(inner, source)
            if called is not None:
                return Wait(_kind(called.partition(" ")[0]), called, inner.where(), inner.function,
                            f"{called}, called from {inner.where()} in {inner.function} (no Python frame of its own)")
            user = next((f for f in t.frames if f.is_user), inner)
            return Wait("elsewhere", "", user.where(), user.function,
                        f"not in torch.distributed: {inner.function} at {inner.where()}")
    return Wait("none", "", "", "", "no Python frames")


def _called(frame: Frame, source: Source | None) -> str | None:
    """The waiting torch.distributed function (or `.wait()`) that the source line of a script's frame calls."""
    if source is None or frame.line is None or not frame.is_user:
        return None
    names = _CALL.findall(source(frame.file, frame.line))
    return next((n if n != "wait" else "wait (a collective's Work)" for n in names if n in WAITS or n == "wait"),
                None)


def _gpu_wait(thread: Thread, source: Source | None) -> Wait | None:
    """`synchronize (waiting for the GPU), called from job.py:11 in <module>`, and `, after all_reduce` when that
    line also calls a collective; None when the innermost frame does not wait for the GPU."""
    inner = thread.frames[0]
    if inner.function == "synchronize" and "/torch/cuda/" in "/" + inner.file.lstrip("/"):
        what, line_frame = "synchronize", next((f for f in thread.frames[1:] if f.is_user), None)
    elif inner.is_user and source is not None and inner.line is not None:
        names = _CALL.findall(source(inner.file, inner.line))
        what = next((n for n in names if n in GPU_WAITS), "")
        if not what:
            return None
        line_frame = inner
    else:
        return None
    shown = f"{what} (waiting for the GPU)"
    if line_frame is None:
        return Wait("gpu", shown, "", "", shown)
    text = f"{shown}, called from {line_frame.where()} in {line_frame.function}"
    collective = ""
    if source is not None and line_frame.line is not None:
        collective = next((n for n in _CALL.findall(source(line_frame.file, line_frame.line)) if n in WAITS), "")
        if collective:
            text += f", after {collective} on that line"
    return Wait("gpu", shown, line_frame.where(), line_frame.function, text, collective)


def _user_below(thread: Thread, frame: Frame) -> Frame | None:
    below = thread.frames[thread.frames.index(frame) + 1:]
    return next((f for f in below if f.is_user), None)
