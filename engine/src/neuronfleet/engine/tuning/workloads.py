"""Named, seeded prompt-length distributions for recommending and benchmarking buckets.

Each workload draws prompt lengths (in tokens) from a lognormal distribution, the
long-tailed shape prompt-length histograms of public datasets commonly show,
clipped below at a floor and above at ``max_model_len`` (a client truncates what
does not fit). The parameters are approximate: they are shaped after the public
sources each docstring names, not fitted to them. Drawing uses
:class:`random.Random` with an explicit seed, so the same name, count and seed give
the same lengths everywhere, without numpy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Workload:
    """A prompt-length distribution and the engine limits it is meant to be served with."""

    name: str
    description: str
    #: Median prompt length in tokens (the lognormal's ``exp(mu)``).
    median: int
    #: Standard deviation of the log length: the spread (about x2.7 per unit).
    sigma: float
    #: Shortest prompt drawn, in tokens.
    minimum: int
    max_num_batched_tokens: int
    max_model_len: int

    def sample(self, count: int, seed: int = 0, max_model_len: int | None = None) -> list[int]:
        """``count`` prompt lengths, the same for the same seed; clipped to ``max_model_len``.

        ``max_model_len`` defaults to the workload's own.
        """
        if count < 1:
            raise ValueError(f"sample count must be at least 1, got {count}")
        cap = self.max_model_len if max_model_len is None else max_model_len
        rng = random.Random(seed)
        mu = math.log(self.median)
        return [min(cap, max(self.minimum, round(rng.lognormvariate(mu, self.sigma)))) for _ in range(count)]


CHAT = Workload(
    name="chat",
    description="Chat turns: mostly a few hundred tokens, a long tail of pasted context.",
    median=300,
    sigma=1.0,
    minimum=8,
    max_num_batched_tokens=8192,
    max_model_len=8192,
)
"""Chat: approximate, shaped after ShareGPT-style conversation prompts.

ShareGPT (user-shared ChatGPT conversations) is the chat dataset vLLM's serving
benchmarks sample prompts from; its prompt lengths are commonly reported as
long-tailed, most under a thousand tokens. Median 300 tokens, sigma 1.0: about two
thirds of prompts fall between roughly 110 and 820 tokens, a few percent exceed 2,000.
"""

SUMMARIZATION = Workload(
    name="summarization",
    description="Long-document summarization: several thousand tokens, chunked by max_num_batched_tokens.",
    median=7000,
    sigma=0.6,
    minimum=512,
    max_num_batched_tokens=8192,
    max_model_len=32768,
)
"""Summarization: approximate, shaped after LongBench's summarization tasks.

LongBench (Bai et al., 2024; its ``LongBench/task.md``) reports average input
lengths of 8,734 words for GovReport, 10,614 for QMSum and 2,113 for MultiNews,
counted by whitespace split; news articles such as CNN/DailyMail are shorter still.
Median 7,000 tokens, sigma 0.6: roughly 3,800 to 12,800 tokens for two thirds of
prompts, so with ``max_num_batched_tokens`` 8192 many prompts take two or more chunks.
"""

CODE_COMPLETION = Workload(
    name="code",
    description="Code completion: the file around the cursor, a few hundred to a couple of thousand tokens.",
    median=900,
    sigma=0.7,
    minimum=32,
    max_num_batched_tokens=8192,
    max_model_len=8192,
)
"""Code completion: approximate, shaped after in-file code completion benchmarks.

For scale, LongBench's LCC task (predict the next line of a long code file)
averages 1,235 whitespace-separated words per input (LongBench ``task.md``);
editor completion clients send a window of the current file of similar size.
Median 900 tokens, sigma 0.7: roughly 450 to 1,800 tokens for two thirds of prompts.
"""

#: The workloads by name, as ``--distribution`` and the benchmark know them.
WORKLOADS: Mapping[str, Workload] = {w.name: w for w in (CHAT, SUMMARIZATION, CODE_COMPLETION)}
