"""Interactive chat in a terminal: streamed answers, multi-turn history through the model's chat
template (the oldest turns dropped when it outgrows the context), reasoning shown dimmed and kept
out of the history, slash commands, line editing with an input history kept in the user cache
directory, multi-line input (paste, or a trailing backslash).

Ctrl-C stops the current answer, not the session. The chat keeps the terminal from turning Ctrl-C
into SIGINT: that signal goes to the whole foreground process group, so a `make run` around the
chat would die of it (after the chat ends). The key is read instead, at the prompt by
prompt_toolkit and during an answer by a watcher thread that interrupts the main thread."""
from __future__ import annotations

import _thread
import os
import select
import sys
import termios
import threading
from contextlib import contextmanager

HELP = ("commands: /reset  /stats  /system TEXT  /budget [SIZE]  /exit (or Ctrl-D); "
        "end a line with \\ to continue it")
DIM, RESET = "\033[2m", "\033[0m"


def input_session():
    """A prompt_toolkit session: line editing, arrow-key history saved across sessions, Enter
    after a trailing backslash continues the message on a new line."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory
    from prompt_toolkit.key_binding import KeyBindings

    from engine.config import cache_dir
    keys = KeyBindings()

    @keys.add("enter")
    def _(event):
        buf = event.current_buffer
        if buf.text.endswith("\\") and buf.cursor_position == len(buf.text):
            buf.delete_before_cursor(1)
            buf.insert_text("\n")
        else:
            buf.validate_and_handle()
    cache_dir().mkdir(parents=True, exist_ok=True)
    return PromptSession(history=FileHistory(str(cache_dir() / "chat_history")), key_bindings=keys,
                         prompt_continuation="... ")


@contextmanager
def no_signal_keys():
    """The terminal passes Ctrl-C (and Ctrl-Z, Ctrl-\\) as bytes and echoes nothing while inside."""
    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    mode = termios.tcgetattr(fd)
    mode[3] &= ~(termios.ISIG | termios.ICANON | termios.ECHO)  # [3]: local modes
    termios.tcsetattr(fd, termios.TCSANOW, mode)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


@contextmanager
def ctrl_c_interrupts():
    """While inside, a Ctrl-C typed raises KeyboardInterrupt in the main thread (as SIGINT would);
    other keys typed meanwhile are dropped. Without a terminal (the chat driven by code) there
    are no keys to watch."""
    if not sys.stdin.isatty():
        yield
        return
    fd, done = sys.stdin.fileno(), threading.Event()

    def watch():
        while not done.is_set():
            if select.select([fd], [], [], 0.05)[0] and b"\x03" in os.read(fd, 1024) and not done.is_set():
                _thread.interrupt_main()
                return
    watcher = threading.Thread(target=watch, name="freetoken-ctrl-c", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


class Chat:
    def __init__(self, llm, params, system: str | None, verbose: bool):
        from engine.server.parsers import select_parsers
        self.llm, self.params, self.verbose = llm, params, verbose
        self.system, self.history = system, []
        tpl = llm.tokenizer.tok.chat_template
        self.reasoning = select_parsers(tpl if isinstance(tpl, str) else None, llm.runner.cfg.model_type)[1]

    def messages(self, history: list[dict] | None = None) -> list[dict]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + (self.history if history is None else history)

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

    def prompt_ids(self) -> list[int]:
        """The conversation's prompt, without its oldest turns while it leaves no room for an
        answer (the system message and the new message always stay); UserError when the new
        message alone does not fit."""
        tok, limit = self.llm.tokenizer, self.llm.runner.max_context
        self.llm.check_prompt(tok.chat(self.messages(self.history[-1:])))
        room, dropped = min(self.params.max_tokens, limit // 2), 0
        ids = tok.chat(self.messages())
        while len(ids) + room > limit and len(self.history) > 1:
            del self.history[:2]  # the oldest user message and its answer
            dropped += 1
            ids = tok.chat(self.messages())
        if dropped:
            print(f"{DIM}(dropped the oldest {dropped} turn{'s' * (dropped > 1)} to fit the {limit}-token context){RESET}")
        return ids
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
        from engine.errors import UserError
        from engine.server.parsers import OutputParser, ReasoningDelta, TextDelta
        self.history.append({"role": "user", "content": text})
        try:
            ids = self.prompt_ids()
        except UserError as e:
            self.history.pop()
            print(f"error: {e}")
            return
        prompt_text = self.llm.tokenizer.decode(ids[-8:], skip_special=False)
        parser = OutputParser(None, self.reasoning, tools_enabled=False,
                              starts_in_reasoning=bool(self.reasoning) and prompt_text.rstrip().endswith("<think>"))
        reply, dim = [], False
        try:
            with ctrl_c_interrupts():
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
        session = input_session()
        with no_signal_keys():
            print(f"FreeToken chat with {self.llm.name}. {HELP}")
            while self.turn(session):
                pass

    def turn(self, session) -> bool:
        """Read and handle one message or command; False ends the chat."""
        try:
            line = session.prompt(">>> ").strip()
            if line.startswith("/"):
                return self.command(line)
            if line:
                self.answer(line)
        except EOFError:
            print()
            return False
        except KeyboardInterrupt:  # at the prompt (or a Ctrl-C that came as an answer ended)
            print("(use /exit or Ctrl-D to quit)")
        return True
