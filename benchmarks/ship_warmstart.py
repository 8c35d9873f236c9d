"""Ship a warm start with swarmlm: pack it (bfloat16 weights) into ``src/swarmlm/sapo/shipped_warmstarts/`` and
record in its ``warmstart.json`` how good the packed model is, as ``benchmarks/warmstart_quality.py`` measures it.

    swarmlm warmstart --train true --out DIR        # the default settings, trained on this machine
    python benchmarks/ship_warmstart.py DIR

The quality is measured on the packed model widened back to float32, which is exactly what every node loads;
``tests/sapo/test_shipped_warmstart.py`` checks the shipped one against this record. A warm start of the default
settings replaces the one shipped before it (the directory is named by the settings' key).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="a warm start written by swarmlm warmstart (its warmstart.json)")
    parser.add_argument("--dest", default=None, help="where to pack it (default: the package's shipped_warmstarts)")
    parser.add_argument("--eval-size", type=int, default=256, help="held-out questions (the node's eval set)")
    parser.add_argument("--groups", type=int, default=128)
    args = parser.parse_args(argv)

    import torch

    from swarmlm.models import load_model
    from swarmlm.runtime.environment import describe_environment
    from swarmlm.sapo.warmstart import SHIPPED_DIR, WarmstartConfig, pack_warmstart, warmstart_info
    from swarmlm.verify import Verifier

    spec = importlib.util.spec_from_file_location("warmstart_quality", HERE / "warmstart_quality.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    packed = pack_warmstart(args.model_dir, Path(args.dest) if args.dest else SHIPPED_DIR)
    info = warmstart_info(packed)
    tasks = WarmstartConfig.model_validate({**info["config"], "out": None}).tasks
    loaded = load_model(str(packed), dtype=torch.float32)
    loaded.model.eval()
    with Verifier(tasks) as verifier:
        report = bench.quality(loaded.model, loaded.tokenizer, tasks, verifier.completion_scores,
                               eval_size=args.eval_size, groups=args.groups, group_size=8, max_new_tokens=32)
    info["quality"] = {key: report[key] for key in ("greedy", "sampled", "signal", "format", "eval_size", "groups",
                                                    "group_size", "per_family")}
    info["quality"]["environment"] = describe_environment()
    (packed / "warmstart.json").write_text(json.dumps(info, indent=1))
    size = sum(p.stat().st_size for p in packed.iterdir())
    print(json.dumps({"packed": str(packed), "bytes": size, **info["quality"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
