"""Usage: cspstock.py RECORDS TRIALS [C6 C8 C9 C11 dense]

The CSP embeddings (csp-relaxed candidates) of the layers csp-relaxed kept on the stock plan:
tune each usable candidate with XGB; records appended (the build's choice times them with the
tuned knobs against the tuned stock plan)."""
import sys, time
sys.path.insert(0, ".")  # run from the repository root
from tvm_csp_embed import tune
from tvm_csp_embed.strategy import CspWorkload, candidates, CYCLE_RANKED, RANK_FACTOR
from vta_ext.config import load_config
path, n = sys.argv[1], int(sys.argv[2])
only = sys.argv[3:]
cfg = load_config("pipelined")
ep = (("bias",), ("shr", 8), ("clip", 0, 127))
def conv(c, h, k, s):
    return CspWorkload("conv2d", (("n", 1), ("c", c), ("h", h), ("w", h), ("k", k), ("kh", 3), ("kw", 3),
                                  ("pt", 1), ("pl", 1), ("pb", 1), ("pr", 1), ("sh", s), ("sw", s)))
layers = {"C6": conv(128, 28, 256, 2), "C8": conv(256, 14, 256, 1), "C9": conv(256, 14, 512, 2),
          "C11": conv(512, 7, 512, 1), "dense": CspWorkload("dense", (("n", 1), ("k", 512), ("m", 1000)))}
option = tune.measure_option(runner=tune.LocalRunner(0))
for name, base in layers.items():
    if only and name not in only:
        continue
    layouts = ["NCHW"] if base.op == "dense" else ["NCHW", "NHWC"]
    t = time.time()
    cands, notes = candidates(cfg, base, "relaxed", layouts, ep)
    usable = sorted([c for c in cands if not c.refused], key=lambda c: c.estimate)
    print("CANDS", name, len(cands), len(usable), notes, f"{time.time()-t:.0f}s", flush=True)
    if not usable:
        continue
    first = usable[0].estimate
    for c in usable[:CYCLE_RANKED]:
        if c.estimate > RANK_FACTOR * first:
            break
        task = tune.Task(base.op, c.workload, ep, "csp-relaxed", cfg)
        t = time.time()
        best = tune.XGBTuner(task, seed=0).tune(n, option, callbacks=[tune.callback.log_to_file(path)])
        print("CSP", name, task.name, "est", int(c.estimate), "best", best.cycles if best else None,
              best.knobs if best else None, f"{time.time()-t:.0f}s", flush=True)
option.runner.close()
