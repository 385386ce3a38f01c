"""Every command the worker's Lua scripts call is one docs/security.md lets its ACL user run.

Redis checks a script's commands against the caller's ACL when the script runs, so a
command added to a claim script without its line in the ACL refuses every claim of a
deployment that followed the documentation (its entries stay pending, retried for ever).
The integration test under real users catches it too, minutes later; this one names the
command.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ["dispatcher/worker/dedup.py", "dispatcher/worker/limit_scripts.py",
           "dispatcher/worker/settle.py"]  # fmt: skip

# redis.call('cmd', ...), redis.pcall('cmd', ...) and the scripts' on(key, 'cmd', ...).
CALL = re.compile(r"(?:redis\.p?call|\bon)\((?:[A-Za-z_.\[\]0-9]+, )?'([a-z]+)'")


def acl_commands(user: str) -> set[str]:
    doc = (ROOT / "docs" / "security.md").read_text()
    [line] = [line for line in doc.splitlines() if line.startswith(f"ACL SETUSER {user} ")]
    return {word[1:] for word in line.split() if word.startswith("+")}


def script_commands() -> dict[str, set[str]]:
    return {path: set(CALL.findall((ROOT / path).read_text())) for path in SCRIPTS}


def test_the_scripts_are_found() -> None:
    found = script_commands()
    assert all(found.values()), found  # the pattern still matches what the scripts say
    assert {"set", "time", "del"} <= set().union(*found.values())


def test_the_worker_user_may_run_every_command_of_its_scripts() -> None:
    allowed = acl_commands("dispatcher-worker")
    refused = {path: sorted(used - allowed) for path, used in script_commands().items()}
    assert refused == {path: [] for path in SCRIPTS}
