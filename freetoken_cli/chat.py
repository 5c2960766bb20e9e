"""Interactive chat in a terminal: streamed answers, multi-turn history through the model's chat
template, reasoning shown dimmed and kept out of the history, slash commands, Ctrl-C stops the
current answer (not the session), multi-line input (paste, or a trailing backslash)."""
from __future__ import annotations

import select
import sys

HELP = ("commands: /reset  /stats  /system TEXT  /budget [SIZE]  /exit (or Ctrl-D); "
        "end a line with \\ to continue it")
DIM, RESET = "\033[2m", "\033[0m"


def read_message(prompt: str = ">>> ") -> str:
    """One user message: continues on a trailing backslash, and takes a pasted block whole."""
    lines = []
    line = input(prompt)
    while True:
        if line.endswith("\\"):
            lines.append(line[:-1])
            line = input("... ")
            continue
        lines.append(line)
        if not select.select([sys.stdin], [], [], 0.05)[0]:  # nothing more pasted
            return "\n".join(lines)
        line = input("")


class Chat:
    def __init__(self, llm, params, system: str | None, verbose: bool):
        from engine.server.parsers import select_parsers
        self.llm, self.params, self.verbose = llm, params, verbose
        self.system, self.history = system, []
        tpl = llm.tokenizer.tok.chat_template
        self.reasoning = select_parsers(tpl if isinstance(tpl, str) else None, llm.runner.cfg.model_type)[1]

    def messages(self) -> list[dict]:
        return ([{"role": "system", "content": self.system}] if self.system else []) + self.history

    def command(self, line: str) -> bool:
        """Handle a slash command; False means exit."""
        cmd, _, arg = line.partition(" ")
        if cmd == "/exit":
            return False
        if cmd == "/reset":
            self.history = []
            print("(history cleared)")
        elif cmd == "/system":
            self.system, self.history = arg.strip() or None, []
            print("(system message set, history cleared)")
        elif cmd == "/budget":
            self.budget(arg.strip())
        elif cmd == "/stats":
            from freetoken_cli.stats import format_stats
            print(format_stats(self.llm.stats))
        else:
            print(HELP)
        return True

    def budget(self, size: str) -> None:
        """/budget SIZE resizes the expert cache (8GiB, 512MiB, auto); /budget alone shows it."""
        from engine.config import parse_size
        from engine.errors import UserError
        try:
            if size:
                self.llm.elastic.set_budget(parse_size(size))
        except UserError as e:
            print(f"error: {e}")
        print(f"({self.llm.elastic.describe()})")

    def answer(self, text: str) -> None:
        from engine.server.parsers import OutputParser, ReasoningDelta, TextDelta
        self.history.append({"role": "user", "content": text})
        ids = self.llm.tokenizer.chat(self.messages())
        prompt_text = self.llm.tokenizer.decode(ids[-8:], skip_special=False)
        parser = OutputParser(None, self.reasoning, tools_enabled=False,
                              starts_in_reasoning=bool(self.reasoning) and prompt_text.rstrip().endswith("<think>"))
        reply, dim = [], False
        try:
            for delta in self.llm.stream(ids, self.params, progress=self.progress):
                for ev in parser.feed(delta):
                    dim = self.show(ev.text, isinstance(ev, ReasoningDelta), dim)
                    if isinstance(ev, TextDelta):
                        reply.append(ev.text)
        except KeyboardInterrupt:
            print(f"{RESET}\n(stopped)", end="")
        for ev in parser.finish():
            dim = self.show(ev.text, isinstance(ev, ReasoningDelta), dim)
            if isinstance(ev, TextDelta):
                reply.append(ev.text)
        print(RESET if dim else "")
        self.history.append({"role": "assistant", "content": "".join(reply).strip()})
        if self.verbose:
            self.command("/stats")

    @staticmethod
    def show(text: str, reasoning: bool, dim: bool) -> bool:
        if reasoning != dim:
            sys.stdout.write(DIM if reasoning else RESET)
        sys.stdout.write(text)
        sys.stdout.flush()
        return reasoning

    @staticmethod
    def progress(done: int, total: int) -> None:
        sys.stderr.write(f"\r(prefill {done}/{total} tokens)" + ("\r\033[K" if done >= total else ""))
        sys.stderr.flush()

    def loop(self) -> None:
        print(f"FreeToken chat with {self.llm.name}. {HELP}")
        while True:
            try:
                line = read_message().strip()
            except EOFError:
                print()
                return
            except KeyboardInterrupt:
                print("\n(use /exit or Ctrl-D to quit)")
                continue
            if not line:
                continue
            if line.startswith("/"):
                if not self.command(line):
                    return
                continue
            self.answer(line)
