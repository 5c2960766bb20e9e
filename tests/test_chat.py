"""Interactive chat driven through a pseudo-terminal: two turns, /stats, /reset, a multi-line
message, Ctrl-C during an answer (stops the answer, not the session), /exit."""
import os
import sys

import pexpect

PROMPT = ">>> "


def test_interactive_session():
    child = pexpect.spawn(sys.executable, ["-m", "freetoken_cli.main", "run", "--device", "cpu",
                                           "--max-tokens", "400", "--ignore-eos"],
                          env=dict(os.environ), encoding="utf-8", timeout=180)
    try:
        child.expect(PROMPT)
        child.sendline("Write a Python function that reverses a string")
        child.expect(PROMPT)
        first = child.before
        assert len(first.strip()) > 20
        child.sendline("/stats")
        child.expect("hit rate")
        child.expect(PROMPT)
        child.sendline("now add a docstring \\")
        child.expect(r"\.\.\. ")
        child.sendline("and a type hint")
        child.expect(PROMPT)
        child.sendline("/reset")
        child.expect("history cleared")
        child.expect(PROMPT)
        child.sendline("Explain list comprehensions")
        child.expect("comprehensions\r?\n")  # the echoed line; the answer starts streaming now
        child.expect(r"\S")
        child.sendintr()  # 400 tokens take seconds: this lands mid-answer
        child.expect("stopped")
        child.expect(PROMPT)  # the session survives Ctrl-C
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0
