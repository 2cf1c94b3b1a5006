"""The few lines each Python rank runs before its script: register faulthandler on the stacks signal (contract.py
STACKS_VAR), so that the launcher's stack dumps read every rank without py-spy or ptrace, then run the script
exactly as `python -u SCRIPT ARGS`, `python -u -m MODULE ARGS` or the `--run-path` runner would. Pure.

A rank's command is `python -u -c LAUNCH WORDS`: WORDS are what python would be given after `-u` (`train.py ARGS`,
`-m pkg.train ARGS`), so that `ps`, top, htop, nvidia-smi and py-spy show the rank as `python -u -c exec(...)
train.py ARGS`, the script's name 63 characters after the interpreter's path. LAUNCH takes the bootstrap's
source from the rank's environment (BOOTSTRAP_VAR, removed there as it starts, so the script and its children do
not inherit it) and runs it. The source is standard library only and imports nothing of ddpboot, so it works with
any PYTHON_EXEC interpreter (one without ddpboot installed, one inside a container that cannot see the launcher's
files). What it keeps as python has it:

- `__main__` is the interpreter's own module (the script's globals, what pickle and multiprocessing's spawn find),
  holding exactly what `python SCRIPT` gives it (`__file__` absolute, a SourceFileLoader, `__cached__` None) and no
  name of the bootstrap's; a directory or zip file runs its `__main__.py` as python does (runpy, sys.path[0] = it);
- sys.argv, sys.path[0] (the script's real directory; the current directory under -m; none under -P), and
  sys.orig_argv as `python -u SCRIPT ARGS` would have it;
- an uncaught exception: the traceback starts at the script (the bootstrap's frames are dropped before
  sys.excepthook prints it), and the interpreter itself then exits as it would (exit code 1, or death by SIGINT
  for a KeyboardInterrupt), after the usual finalisation; SystemExit is the interpreter's own, untouched.

What differs: three frames named `<string>` below the script's in a live stack (py-spy, faulthandler; the summary
skips them), one open file (the stacks file, close-on-exec), and the process's command line, which `--dry-run` and
the failure report show as `python -u SCRIPT ARGS` (launch/env.py).
"""

from __future__ import annotations

from collections.abc import Sequence

KINDS = ("script", "module", "run_path")
BOOTSTRAP_VAR = "DDPBOOT_BOOTSTRAP"
LAUNCH = f'exec(__import__("os").environ.pop("{BOOTSTRAP_VAR}"))'
"""The `-c` code of every Python rank: it binds no name in `__main__` (`os` is not left behind)."""

CODE = '''\
# ddpboot rank bootstrap: faulthandler on DDPBOOT_STACKS, then the script as python runs it
def _ddpboot_rank(kind):
    import os, sys
    g = globals()
    del g["_ddpboot_rank"]
    signo, _, path = os.environ.get("DDPBOOT_STACKS", "").partition(":")
    if signo.isdigit() and path:
        try:
            import faulthandler
            faulthandler.register(int(signo), file=open(path, "a"), all_threads=True, chain=False)
        except Exception:
            pass
    argv = sys.argv
    words = argv[1:]
    if kind == "module":
        words = words[1:]
    name, sys.argv = words[0], words
    orig = getattr(sys, "orig_argv", None)
    head = orig[:len(orig) - len(argv) - 1] if orig else None
    keep = not getattr(sys.flags, "safe_path", False)
    set_file = False
    if kind == "module":
        import runpy
        sys.argv = ["-m", *words[1:]]
        if keep:
            sys.path[0] = os.getcwd()
        run = lambda: runpy._run_module_as_main(name)
    elif kind == "run_path":
        import runpy
        head = None
        run = lambda: runpy.run_path(name, run_name="__main__")
    else:
        full = name if os.path.isabs(name) else os.path.join(os.getcwd(), name)
        importer = sys.path_importer_cache.get(full)
        if full not in sys.path_importer_cache:
            for hook in sys.path_hooks:
                try:
                    importer = hook(full)
                    break
                except ImportError:
                    pass
            sys.path_importer_cache[full] = importer
        if importer is not None:
            import runpy
            if keep:
                sys.path[0] = full
            else:
                sys.path.insert(0, full)
            run = lambda: runpy._run_module_as_main("__main__", False)
        else:
            if keep:
                sys.path[0] = os.path.dirname(os.path.realpath(name))
            try:
                with open(full, "rb") as f:
                    source = f.read()
            except OSError as e:
                prog = orig[0] if orig else sys.executable
                print(f"{prog}: can't open file {full!r}: [Errno {e.errno}] {e.strerror}", file=sys.stderr)
                raise SystemExit(2)
            set_file = "__file__" not in g
            g.update(__file__=full, __cached__=None,
                     __loader__=sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", full))
            run = lambda: exec(compile(source, full, "exec", dont_inherit=True), g)
    if head is not None:
        sys.orig_argv = head + argv[1:]
    def unset():
        if set_file:
            g.pop("__file__", None)
            g.pop("__cached__", None)
    try:
        run()
        unset()
    except SystemExit:
        raise
    except BaseException as e:
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        hook = sys.excepthook
        def once(t, v, _):
            sys.excepthook = hook
            v.__traceback__ = sys.last_traceback = tb
            hook(t, v, tb)
            unset()
        sys.excepthook = once
        raise
'''
"""The bootstrap (see the module's docstring), without its call (rank_command adds it, with the target's kind). The
launcher's variable names are spelled out: contract.STACKS_VAR, whose value contract.register_stacks parses the
same way."""


def rank_command(python: str, kind: str, name: str, args: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """A Python rank's command line (LAUNCH, then the words python would be given) and the variable that carries
    the bootstrap, for its environment."""
    if kind not in KINDS:
        raise ValueError(f"not a Python target kind: {kind!r}")
    words = ["-m", name, *args] if kind == "module" else [name, *args]
    return [python, "-u", "-c", LAUNCH, *words], {BOOTSTRAP_VAR: f"{CODE}_ddpboot_rank({kind!r})\n"}
