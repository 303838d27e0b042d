"""Training recipe of each preset: batch, segment and memory lengths for training and evaluation, and the schedule.

Read only by the scripts (`training.arguments.resolve`: the lowest layer of a run's settings); the architecture of a
preset is `configuration_transformer_xl.PRESETS`, which saved model folders carry.
"""

from __future__ import annotations

# Dai et al. 2019 (Table 1 and the released scripts) and Yang et al. 2019 (Table 7); `eval_*`: the evaluation's segment,
# memory and clamp lengths (the paper evaluates with a longer memory than it trains with).
RECIPES: dict[str, dict] = {
    "debug": dict(batch_size=4, tgt_len=8, mem_len=8, eval_tgt_len=8, eval_mem_len=16, eval_clamp_len=-1,
                  learning_rate=1e-3, warmup_steps=0, max_steps=20),
    # tiny: chosen by held-out perplexity on WikiText-2 (word), tiny-shakespeare (character) and the built-in corpus at
    # 400 and 1,500 steps (benchmarks/bench_recipe.py, table in docs/pretraining.md): clipping at 1.0 is best or
    # within 2% of the best in every cell; no clipping (the recipe of 2026-11-25, which removed a loss spike of the
    # first 30 steps) lost up to 17% (WikiText-2, 400 steps), and 1e-3 lost everywhere it was tried. The spike comes
    # back (docs/troubleshooting.md) but costs nothing at the end; `--max_grad_norm 0` avoids it.
    "tiny": dict(batch_size=16, tgt_len=64, mem_len=64, eval_tgt_len=64, eval_mem_len=128, eval_clamp_len=-1,
                 learning_rate=3e-3, warmup_steps=50, max_steps=1500, max_grad_norm=1.0),
    "wt103-base": dict(batch_size=60, tgt_len=150, mem_len=150, eval_tgt_len=64, eval_mem_len=640, eval_clamp_len=400,
                       learning_rate=2.5e-4, warmup_steps=0, max_steps=200_000),
    "wt103-large": dict(batch_size=128, tgt_len=384, mem_len=384, eval_tgt_len=128, eval_mem_len=1600,
                        eval_clamp_len=1000, learning_rate=2.5e-4, warmup_steps=16_000, max_steps=4_000_000),
    "enwik8-base": dict(batch_size=22, tgt_len=512, mem_len=512, eval_tgt_len=80, eval_mem_len=2100,
                        eval_clamp_len=820, learning_rate=2.5e-4, warmup_steps=0, max_steps=400_000),
    "enwik8-large": dict(batch_size=64, tgt_len=768, mem_len=768, eval_tgt_len=128, eval_mem_len=3800,
                         eval_clamp_len=1000, learning_rate=2.5e-4, warmup_steps=4_000, max_steps=400_000),
    # XLNet-Large pretraining (Table 7: batch 8192, seq 512, mem 384, lr 4e-4, 40k warmup, 500k steps, linear decay);
    # the paper gives no separate schedule for base, so it shares this one.
    "xlnet-base": dict(batch_size=8192, tgt_len=512, mem_len=384, eval_tgt_len=512, eval_mem_len=384, eval_clamp_len=-1,
                       learning_rate=4e-4, warmup_steps=40_000, max_steps=500_000),
    "xlnet-large": dict(batch_size=8192, tgt_len=512, mem_len=384, eval_tgt_len=512, eval_mem_len=384,
                        eval_clamp_len=-1, learning_rate=4e-4, warmup_steps=40_000, max_steps=500_000),
}
