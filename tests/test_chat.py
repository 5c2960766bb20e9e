"""Interactive chat driven through a pseudo-terminal: two turns, /stats, /reset, a multi-line
message, Ctrl-C at the prompt, /exit; a history that outgrows the context; arrow-key recall of
the input history across sessions; an empty prompt; `make run` exits 0 after Ctrl-C at the prompt
and during an answer (which stops the answer, not the session).

Keys typed while an answer streams are dropped (only Ctrl-C is looked for), so each test waits
for the end of an answer (--verbose prints the stats after it) before typing on; keys typed at
any other time wait for the next prompt."""
import os
import re
import shutil
import sys
from pathlib import Path

import pexpect
import pytest

REPO = Path(__file__).resolve().parents[1]
ANSWERED = "hit rate"      # the stats line --verbose prints after every answer
ACCEPTED = "\x1b[?2004l"   # prompt_toolkit turns bracketed paste off as it takes the line
UP = "\x1b[A"


def env() -> dict:
    return {**os.environ, "PROMPT_TOOLKIT_NO_CPR": "1"}  # a pseudo-terminal answers no cursor-position requests


def chat(*args: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "freetoken_cli.main", "run", "--device", "cpu", "--verbose", *args],
                          env=env(), encoding="utf-8", timeout=180)
    child.expect("FreeToken chat with")
    return child


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def finish(child: pexpect.spawn) -> int:
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    return child.exitstatus


def test_interactive_session():
    child = chat("--max-tokens", "12", "--ignore-eos")
    try:
        child.sendline("Write a Python function that reverses a string")
        child.expect(ANSWERED)
        assert len(plain(child.before).split("reverses a string", 1)[1].rsplit("prompt ", 1)[0].strip()) > 20
        child.sendline("/stats")
        child.expect(ANSWERED)
        child.sendline("now add a docstring \\")
        child.expect(r"\.\.\.")  # the continuation prompt
        child.sendline("and a type hint")
        child.expect(ANSWERED)
        child.sendline("/reset")
        child.expect("history cleared")
        child.sendintr()  # at the prompt
        child.expect("use /exit or Ctrl-D")
    finally:
        status = finish(child)
    assert status == 0


def test_long_chat_drops_the_oldest_turns_and_goes_on():
    child = chat("--max-context", "128", "--max-tokens", "16", "--ignore-eos")
    try:
        said = ""
        for i in range(5):
            child.sendline(f"Question {i}: write a short Python function")
            child.expect(ANSWERED)
            said += child.before
        assert "dropped the oldest" in said
        child.sendline("word " * 300)  # alone longer than the context: refused, the session goes on
        child.expect("error: the prompt has")
        child.expect("raise --max-context")
        child.sendline("And one more question")
        child.expect(ANSWERED)
    finally:
        status = finish(child)
    assert status == 0


def test_arrow_keys_recall_the_input_history_across_sessions():
    from engine.config import cache_dir
    child = chat()
    child.sendline("/system recall-me-7")
    child.expect("system message set")
    child.send(UP + "\r")  # the line just sent, again
    child.expect("system message set")
    assert finish(child) == 0
    assert "recall-me-7" in (cache_dir() / "chat_history").read_text()
    child = chat()
    child.send(UP + UP + "\r")  # back past /exit
    child.expect("recall-me-7")
    child.expect("system message set")
    assert finish(child) == 0


def test_an_empty_prompt_is_an_error():
    child = pexpect.spawn(sys.executable, ["-m", "freetoken_cli.main", "run", "--prompt", ""], env=env(),
                          encoding="utf-8", timeout=60)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert child.before.strip() == "error: the prompt is empty: give some text with --prompt or on stdin"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_run_exits_0_after_ctrl_c_in_the_chat(tmp_path):
    # make dies of a SIGINT sent to the terminal's process group once its recipe ends, whatever
    # the recipe's status: the chat must read Ctrl-C as a key
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "freetoken"
    exe.write_text(f'#!/bin/sh\nexec {sys.executable} -m freetoken_cli.main "$@"\n')
    exe.chmod(0o755)
    (venv / ".installed").touch()  # newer than pyproject.toml: make skips the install
    child = pexpect.spawn("make", ["-s", "-C", str(REPO), "run", f"VENV={venv}",
                                   "ARGS=--device cpu --verbose --max-tokens 1000 --ignore-eos"],
                          env=env(), encoding="utf-8", timeout=180)
    child.expect("FreeToken chat with")
    child.sendintr()  # at the prompt
    child.expect("use /exit or Ctrl-D")
    child.sendline("Explain list comprehensions")
    child.expect_exact(ACCEPTED)
    child.expect(r"\S")  # the answer streams; 1000 tokens take long
    child.sendintr()
    child.expect("stopped")
    assert finish(child) == 0
    assert "Interrupt" not in child.before
