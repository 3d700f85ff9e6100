"""Multi-turn conversations against one completions URL, for ``bench/prefix_routing.py`` (run in the real node's
network namespace, where the Services' cluster IPs answer).

Each of ``--conversations`` clients holds one conversation at a time on one of ``--prefixes`` shared system
prompts: every turn sends the system prompt, the conversation so far and a new user message, and after
``--think`` seconds sends the next, the earlier turn's prompt a prefix of it; after ``--turns`` turns the client
starts a new conversation. A turn asks for one token (its latency is its time to first token) and the client
writes the reply itself, ``--reply-tokens`` words; with ``--generate`` the engine writes it, streamed, and the
turn's latency is the time to its first token. Only then is the reply's KV cache on the replica that wrote it,
as in a real chat: a turn sent back there prefills its new message alone. Every request goes on a
connection of its own, so a Service's kube-proxy picks a replica per request. Before the clients start, each
system prompt is sent once alone (``warmup``, not a turn): shared system prompts live long in a real fleet, so
the window measures conversations, not the first prefill of each prompt. Prompts are words of the simulated
tokenizer's vocabulary, drawn from seeded random generators: the same seed gives every side the same
conversations. Prints one JSON line per answered or failed request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time

import httpx

#: Words the simulated device's tokenizer knows: one token each.
VOCABULARY = ("bada", "bade", "badi", "bado", "badu", "beda", "bede", "bedi")
REPLICA_HEADER = "x-neuronfleet-replica"


def words(seed: str, count: int) -> str:
    """``count`` vocabulary words drawn by a generator seeded with ``seed``."""
    draw = random.Random(seed)
    return " ".join(draw.choice(VOCABULARY) for _ in range(count))


async def converse(client_index: int, http: httpx.AsyncClient, args: argparse.Namespace, deadline: float) -> None:
    """One client's conversations, turn by turn, until ``deadline``."""
    conversation = 0
    while time.monotonic() < deadline:
        key = f"{args.seed}/{client_index}/{conversation}"
        prefix = (client_index + conversation) % args.prefixes
        history = [words(f"{args.seed}/system/{prefix}", args.system_tokens)]
        for turn in range(args.turns):
            if time.monotonic() >= deadline:
                return
            history.append(words(f"{key}/user/{turn}", args.user_tokens))
            about = {"client": client_index, "prefix": prefix, "turn": turn}
            if args.generate:
                history.append(await generate(http, " ".join(history), args, about))
            else:
                await send(http, " ".join(history), args, about)
                history.append(words(f"{key}/reply/{turn}", args.reply_tokens))
            await asyncio.sleep(args.think)
        conversation += 1


async def send(http: httpx.AsyncClient, prompt: str, args: argparse.Namespace, about: dict[str, object]) -> None:
    """One turn on a connection of its own (``http`` keeps none open); its outcome as a JSON line."""
    body = {"model": args.model, "prompt": prompt, "max_tokens": 1}
    started = time.monotonic()
    outcome: dict[str, object] = {**about, "prompt_words": len(prompt.split())}
    try:
        response = await http.post(args.url, json=body, headers={"Connection": "close"})
        outcome.update(status=response.status_code, replica=response.headers.get(REPLICA_HEADER))
    except httpx.HTTPError as error:
        outcome.update(status=type(error).__name__, replica=None)
    outcome["latency_s"] = time.monotonic() - started
    print(json.dumps(outcome), flush=True)


async def generate(http: httpx.AsyncClient, prompt: str, args: argparse.Namespace, about: dict[str, object]) -> str:
    """One turn whose reply the engine writes, streamed on a connection of its own: its outcome as a JSON line, its
    latency the time to the first token; returns the reply (one the client writes, if the turn failed)."""
    body = {"model": args.model, "prompt": prompt, "max_tokens": args.reply_tokens, "stream": True}
    started = time.monotonic()
    outcome: dict[str, object] = {**about, "prompt_words": len(prompt.split())}
    pieces: list[str] = []
    try:
        async with http.stream("POST", args.url, json=body, headers={"Connection": "close"}) as response:
            outcome.update(status=response.status_code, replica=response.headers.get(REPLICA_HEADER))
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                if not pieces:
                    outcome["latency_s"] = time.monotonic() - started
                pieces.append(json.loads(line.removeprefix("data: "))["choices"][0]["text"])
    except httpx.HTTPError as error:
        outcome.update(status=type(error).__name__, replica=None)
    reply = "".join(pieces)
    if outcome.get("status") == 200 and len(reply.split()) != args.reply_tokens:
        outcome["status"] = f"reply of {len(reply.split())} words, not {args.reply_tokens}"
    outcome.setdefault("latency_s", time.monotonic() - started)
    outcome["reply_s"] = time.monotonic() - started
    print(json.dumps(outcome), flush=True)
    return reply if outcome["status"] == 200 else words(f"{about}/reply", args.reply_tokens)


async def main() -> None:
    """Run the clients for ``--duration`` seconds."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--prefixes", type=int, default=3)
    parser.add_argument("--system-tokens", type=int, default=1500)
    parser.add_argument("--user-tokens", type=int, default=60)
    parser.add_argument("--reply-tokens", type=int, default=30)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--think", type=float, default=1.5)
    parser.add_argument("--generate", action="store_true", help="the engine writes each reply (streamed)")
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--seed", default="0")
    args = parser.parse_args()
    # One client for every turn, keeping no connection open: making a client costs ~25 ms of CPU (its TLS
    # context), which a client per turn would add to every latency measured.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=args.timeout, limits=limits) as http:
        for prefix in range(args.prefixes):
            system = words(f"{args.seed}/system/{prefix}", args.system_tokens)
            await send(http, system, args, {"warmup": True, "prefix": prefix})
        deadline = time.monotonic() + args.duration
        await asyncio.gather(*(converse(i, http, args, deadline) for i in range(args.conversations)))


if __name__ == "__main__":
    asyncio.run(main())
    sys.exit(0)
