"""The launcher's option values (ddpboot/launch/options.py): torchrun's forms, each error naming the option."""

from __future__ import annotations

import math
import signal

import pytest

from ddpboot.errors import UsageError
from ddpboot.launch.options import (
    DEFAULT_SIGNALS,
    Std,
    check_rank_filter,
    parse_prefix_template,
    parse_rank_list,
    parse_rdzv_conf,
    parse_signals,
    parse_std,
    resolve_std,
)
from ddpboot.units import parse_duration


def test_std_specs_any_rank_number() -> None:
    assert parse_std("3", "-r") == Std.ALL
    assert parse_std("0:1,10:2", "-r") == {0: Std.OUT, 10: Std.ERR}
    assert resolve_std(parse_std("0:1,10:2", "-r"), 11, "-r") == {**dict.fromkeys(range(11), Std.NONE),
                                                                   0: Std.OUT, 10: Std.ERR}
    assert resolve_std(Std.ERR, 3, "-t") == {0: Std.ERR, 1: Std.ERR, 2: Std.ERR}
    for bad, msg in (("4", "is not RANK:VALUE"), ("0:4", "is not RANK:VALUE"), ("", "is empty"),
                     ("1:1,1:2", "twice"), ("a:1", "is not RANK:VALUE")):
        with pytest.raises(UsageError, match=msg):
            parse_std(bad, "-r")
    with pytest.raises(UsageError, match="names local rank 10, but this node runs 2 ranks"):
        resolve_std({10: Std.OUT}, 2, "-r")


def test_rank_lists() -> None:
    assert parse_rank_list("0,2-4, 7", "--ranks-filter") == {0, 2, 3, 4, 7}
    for bad in ("", "a", "3-1", "1,,2", "-1"):
        with pytest.raises(UsageError):
            parse_rank_list(bad, "--ranks-filter")


def test_signal_lists() -> None:
    assert parse_signals("SIGTERM,int, 10,SIGTERM") == (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    with pytest.raises(UsageError, match="is not a signal"):
        parse_signals("SIGNOPE")
    for sig in ("SIGKILL", "STOP", "SIGCHLD"):
        with pytest.raises(UsageError, match="cannot be handled"):
            parse_signals(sig)


def test_rendezvous_values() -> None:
    assert parse_rdzv_conf("timeout=900, join_timeout=10,") == {"timeout": "900", "join_timeout": "10"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_rdzv_conf("timeout")


def test_rank_filters_name_only_ranks_the_job_has() -> None:
    check_rank_filter(frozenset({0, 3}), 4, "--ranks-filter", "rank")
    with pytest.raises(UsageError, match=r"--local-ranks-filter names local rank 2, 3, but the job has 2 \(local "
                                         r"ranks 0-1\)"):
        check_rank_filter(frozenset({0, 2, 3}), 2, "--local-ranks-filter", "local rank")


def test_default_signals_parse() -> None:
    assert parse_signals(DEFAULT_SIGNALS)[:2] == (signal.SIGINT, signal.SIGTERM)


def test_durations() -> None:
    assert parse_duration(0, "--shutdown-timeout") == 0.0
    assert parse_duration(2, "--monitor-interval", allow_zero=False) == 2.0
    for text, seconds in (("2s", 2.0), ("1.5m", 90.0), (" 2H ", 7200.0), ("0.5", 0.5), ("1d", 86400.0)):
        assert parse_duration(text, "--stall-timeout") == seconds
    assert parse_duration("inf", "--wait-for-gpus", allow_inf=True) == math.inf
    for value, allow_zero, need in ((-1.0, True, "give zero or more seconds"), ("-2m", False, "more than zero"),
                                    (math.nan, True, "is not a duration"),
                                    ("2 weeks", True, "is not a duration"), ("inf", True, "give a finite time"),
                                    (0.0, False, "give more than zero seconds")):
        with pytest.raises(UsageError, match=f"--x .*{need}.*e.g. 30, 90s, 10m, 2h"):
            parse_duration(value, "--x", allow_zero=allow_zero)


def test_prefix_templates_take_torchruns_names_and_node_rank() -> None:
    for good in ("[${role_name}${local_rank}]:", "${hostname}:${rank}: ", "$rank|$node_rank ", "cost $$5 ", ""):
        assert parse_prefix_template(good) == good  # used as written, spaces included
    with pytest.raises(UsageError, match=r"unknown name \$\{local_rnak\}; a prefix can use \$\{rank\}, "
                       r"\$\{local_rank\}, \$\{node_rank\}, \$\{role_name\}, \$\{hostname\}"):
        parse_prefix_template("[${local_rnak}]")
    with pytest.raises(UsageError, match=r"unknown names \$\{pid\}, \$\{host\}"):
        parse_prefix_template("$pid ${host}")
    for bad in ("${rank", "cost $5", "${}", "$"):
        with pytest.raises(UsageError, match=r"a '\$' that begins no \$\{name\}; write \$\$"):
            parse_prefix_template(bad)
