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
    # tiny: no gradient clipping. Its learning rate is 12x the paper's, and clipping the global norm to 0.25 hid from
    # Adam the growth of the gradients as the loss left the unigram plateau (steps 10-30): the loss climbed from 7.1 to
    # 14.7 (1,500 steps) or from 7.4 to 24.4 (--max_train_steps 400) before recovering; unclipped, Adam's second moment
    # follows the growth and the curve falls smoothly (docs/troubleshooting.md, "loss spike").
    "tiny": dict(batch_size=16, tgt_len=64, mem_len=64, eval_tgt_len=64, eval_mem_len=128, eval_clamp_len=-1,
                 learning_rate=3e-3, warmup_steps=50, max_steps=1500, max_grad_norm=0.0),
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
