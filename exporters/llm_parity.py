"""Parity of an onnxruntime-genai export with transformers: greedy token ids on a few chat prompts.

At fp32 the two should agree token for token (float summation order aside); an int4 export
drifts, and what is worth knowing is how soon: the report gives, per prompt, how many tokens
agree before the first difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

PARITY_PROMPTS = (
    "What is the capital of France?",
    "Name three primary colors.",
    "Write one sentence about the sea.",
)


@dataclass(frozen=True)
class PromptParity:
    prompt: str
    expected: list[int]  # transformers' greedy ids (float32), up to EOS or the token limit
    actual: list[int]  # the export's greedy ids

    @property
    def agreeing(self) -> int:
        """Tokens equal before the first difference."""
        count = 0
        for want, got in zip(self.expected, self.actual, strict=False):
            if want != got:
                break
            count += 1
        return count

    @property
    def identical(self) -> bool:
        return self.expected == self.actual


@dataclass(frozen=True)
class ParityReport:
    precision: str
    max_new_tokens: int
    prompts: list[PromptParity]

    @property
    def identical(self) -> bool:
        return all(p.identical for p in self.prompts)

    def describe(self) -> str:
        lines = [f"greedy parity vs transformers (float32), {self.max_new_tokens} new tokens:"]
        for p in self.prompts:
            verdict = (
                "identical"
                if p.identical
                else f"first {p.agreeing} of {len(p.expected)} tokens agree"
            )
            lines.append(f"  {p.prompt!r}: {verdict}")
        return "\n".join(lines)


def transformers_greedy(hf_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    results = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_length=len(ids) + max_new_tokens,  # the config's own max_length aside
                do_sample=False,
            )
            results.append([t for t in out[0, len(ids) :].tolist() if t not in eos_ids])
    return results


def genai_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list:
    import onnxruntime_genai as og

    model = og.Model(str(model_dir))
    eos = model_eos(model_dir)
    results = []
    for ids in prompts:
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + max_new_tokens)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        new: list[int] = []
        while not generator.is_done() and len(new) < max_new_tokens:
            generator.generate_next_token()
            new.append(int(generator.get_next_tokens()[0]))
        results.append([t for t in new if t not in eos])
    return results


def model_eos(model_dir: Path) -> set[int]:
    import json

    eos = json.loads((model_dir / "genai_config.json").read_text())["model"]["eos_token_id"]
    return set(eos if isinstance(eos, list) else [eos])


def compare(
    hf_dir: Path, model_dir: Path, precision: str, max_new_tokens: int = 24
) -> ParityReport:
    """Greedy ids of both on the chat-templated PARITY_PROMPTS, encoded as Ferry serves them."""
    from ferry.llm.chat_tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer(model_dir)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": p}]) for p in PARITY_PROMPTS]
    expected = transformers_greedy(hf_dir, prompts, max_new_tokens)
    actual = genai_greedy(model_dir, prompts, max_new_tokens)
    return ParityReport(
        precision,
        max_new_tokens,
        [PromptParity(p, e, a) for p, e, a in zip(PARITY_PROMPTS, expected, actual, strict=True)],
    )
