"""`ddpboot warm status|stop`: this user's warm process on this node (launch/faststart/warm.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from ddpboot.errors import UsageError
from ddpboot.launch.faststart import warm as warm_process

ACTIONS = ("status", "stop")


def warm(action: str, as_json: bool, env: Mapping[str, str]) -> int:
    if action == "start":
        raise UsageError("ddpboot warm start: there is no separate start: the first warm launch, `ddpboot --warm "
                         "SCRIPT` (or DDPBOOT_WARM=1 in the environment), starts this user's warm process, and the "
                         "next ones use it. `ddpboot warm status` shows it, `ddpboot warm stop` ends it.")
    if action not in ACTIONS:
        raise UsageError(f"ddpboot warm {action}: give status or stop (the first `ddpboot --warm SCRIPT` starts a "
                         "warm process).")
    answer = warm_process.request(env, action)
    where = str(warm_process.socket_path(env))
    if as_json:
        print(json.dumps(_json(action, answer, where, env), indent=2))
        return 0
    if answer is None:
        last = warm_process.last_exit(env)
        why = f" (the last one, pid {last['pid']}, exited: {last['why']})" if last else ""
        print(f"no warm process of yours runs on this node{why}; `ddpboot --warm SCRIPT` starts one")
        return 0
    if action == "stop":
        going = answer.get("sessions") or []
        print(f"stopped the warm process (pid {answer['pid']})"
              + (f"; the {len(going)} launch{'es' if len(going) > 1 else ''} it serves go on until they end"
                 if going else ""))
        return 0
    print(_status_text(answer))
    return 0


def _json(action: str, answer: dict[str, Any] | None, where: str, env: Mapping[str, str]) -> dict[str, Any]:
    if answer is None:
        return {"running": False, "socket": where, "last_exit": warm_process.last_exit(env)}
    out = {k: v for k, v in answer.items() if k != "op"}
    if action == "stop":
        return {"running": False, "stopped": out["pid"], "sessions": out.get("sessions", []), "socket": where}
    return {"running": True, **out}


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _status_text(s: dict[str, Any]) -> str:
    now = time.time()
    preload = ", ".join(s.get("preload") or []) or "nothing else"
    lines = [
        f"warm process pid {s['pid']}, up {_ago(now - s['started'])}, {s['launches']} launch"
        f"{'es' if s['launches'] != 1 else ''} served",
        f"  python {s['python']}, torch {s.get('torch') or '(not installed)'}, preloads {preload}",
        f"  {s['files']} imported files watched; socket {s['socket']}",
    ]
    sessions = s.get("sessions") or []
    for one in sessions:
        lines.append(f"  serving launcher pid {one['launcher']} since {_ago(now - one['since'])} ago, in {one['cwd']}")
    if not sessions and s.get("idle_since") is not None:
        left = s["idle"] - (now - s["idle_since"])
        lines.append(f"  idle for {_ago(now - s['idle_since'])}; exits in {_ago(left)} without a launch")
    return "\n".join(lines)
