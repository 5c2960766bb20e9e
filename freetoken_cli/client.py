"""One-shot `run` through a `freetoken serve` of the same model, when one answers where `serve`
listens (FREETOKEN_HOST, FREETOKEN_PORT; FREETOKEN_API_KEY when it wants a key), so the answer
costs no load. It is the same model when its /v1/models card's `source` is MODEL as `model_key`
names it, or its `root` (FTW directory) is; the server's engine options are its own. With nothing
listening the probe is refused at once. A listener silent for PROBE_S, or a server of another
model, still loading or wanting a key, gets one note on stderr, and `run` loads the model itself."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Iterator, Optional

import typer

from freetoken_cli.serve import ApiKey, Host, Port

PROBE_S = 1.0


def address() -> str:
    from engine.errors import UserError
    host, port = os.environ.get(Host.envvar, Host.default), os.environ.get(Port.envvar, str(Port.default))
    if not port.isdigit():
        raise UserError(f"{Port.envvar}={port!r} is not a port; set it to the port `freetoken serve` listens on")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host  # a server on every address answers on loopback
    return f"http://{f'[{host}]' if ':' in host else host}:{port}"


def _request(url: str, body: Optional[dict] = None) -> urllib.request.Request:
    key = os.environ.get(ApiKey.envvar)
    headers = {"content-type": "application/json", **({"authorization": f"Bearer {key}"} if key else {})}
    return urllib.request.Request(url, json.dumps(body).encode() if body else None, headers)


def find_server(model: Optional[str]) -> Optional[tuple[str, str]]:
    """(base URL, served model name) of a server of MODEL that answers, else None."""
    from engine.resolve import model_key
    base = address()
    note = lambda why: typer.echo(f"note: the server at {base} {why}; loading the model here", err=True)  # noqa: E731
    try:
        with urllib.request.urlopen(_request(base + "/v1/models"), timeout=PROBE_S) as r:
            cards = json.load(r)["data"]
    except urllib.error.HTTPError as e:
        note({401: f"wants an API key (set {ApiKey.envvar})",
              503: "is still loading"}.get(e.code, f"answered {e.code}"))
        return None
    except (TimeoutError, urllib.error.URLError) as e:
        if isinstance(getattr(e, "reason", e), TimeoutError):
            note(f"did not answer within {PROBE_S:g} s")
        return None  # nothing listens: the usual case, said nothing about
    except (OSError, ValueError, KeyError, TypeError):
        return None  # something else listens there
    key = model_key(model)
    name = next((c["id"] for c in cards if key in (c.get("source"), c.get("root"))), None)
    if name is None:
        note(f"serves {', '.join(c.get('id', '?') for c in cards)}, not {model or 'the demo model'}")
        return None
    return base, name


def stream(base: str, name: str, text: str, raw: bool, messages: list[dict], params) -> Iterator[str]:
    """The answer's text deltas, as `LLM.stream` yields them in-process: the chat API with the
    reasoning left in the text (or the completions API for --raw), the same sampling options."""
    from engine.errors import UserError
    body = {"model": name, "stream": True, "max_tokens": params.max_tokens, "temperature": params.temperature,
            "top_p": params.top_p, "top_k": params.top_k, "seed": params.seed, "ignore_eos": params.ignore_eos}
    if raw:
        path, body["prompt"] = "/v1/completions", text
    else:
        path, body["messages"], body["separate_reasoning"] = "/v1/chat/completions", messages, False
    try:
        with urllib.request.urlopen(_request(base + path, body)) as r:
            for line in r:  # server-sent events, one `data: JSON` line each
                if not line.startswith(b"data: "):
                    continue
                if line[6:].strip() == b"[DONE]":
                    return
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise UserError(f"the server at {base}: {chunk['error']['message']}")
                for c in chunk.get("choices", []):
                    if delta := c.get("text") if raw else c["delta"].get("content"):
                        yield delta
    except urllib.error.HTTPError as e:
        try:
            why = json.load(e)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            why = f"HTTP {e.code}"
        raise UserError(f"the server at {base}: {why}") from None
    except OSError as e:  # refused, reset, or gone mid-answer
        raise UserError(f"lost the server at {base} ({getattr(e, 'reason', e)}); run again, "
                        "or pass --no-server") from None
