#!/usr/bin/env python
"""Pretrain Transformer-XL (or an XLNet-style permutation LM) with Accelerate.

    accelerate launch scripts/pretrain.py --preset tiny --output_dir outputs/tiny      # or plain `python`
    python scripts/pretrain.py --config run.yaml --max_train_steps 2000               # YAML + overrides

Everything lives in `modeling_xl.training` (arguments, data, model, loop, checkpoints, publishing); see --help.
"""

import logging
import sys

from modeling_xl.training import HubUploadError, NonFiniteLossError, parse_args, run_pretraining


def main(argv=None) -> int:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    try:
        args = parse_args(argv)
        results = run_pretraining(args)
    except (ValueError, NonFiniteLossError, HubUploadError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1 if not isinstance(error, HubUploadError) else 2
    except RuntimeError as error:  # torch.distributed's DistBackendError included
        if "timed out" not in str(error).lower() and "timeout" not in str(error).lower():
            raise
        print(f"error: another process did not answer within ddp_timeout={args.ddp_timeout} seconds (stalled, "
              f"stopped or dead); the run ended instead of waiting forever. Resume from the last checkpoint with "
              f"--resume_from_checkpoint latest (raise --ddp_timeout for long pauses such as a slow evaluation or "
              f"save). Cause: {str(error).splitlines()[0]}", file=sys.stderr)
        return 1
    print("validation: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in results.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
