"""Accuracy on real data: scikit-learn's handwritten digits, float vs int8 on ext_vta.

A small CNN is trained in a few seconds (fixed seed) on the 8x8 digits that ship with
scikit-learn (1,797 images, nothing downloaded), then quantised both ways:

* **power of two**: ``vta_ext.quantize.quantize_torch`` (BN folding, calibrated power-of-two scales,
  requantisation by shifts);
* **PT2E**: PyTorch's own flow (``torchao.quantization.pt2e``: ``prepare_pt2e`` with
  ``vta_ext.quantize.symmetric_quantizer`` (symmetric int8, per-channel weights), calibration,
  ``convert_pt2e``), mapped by ``vta_ext.quantize.quantize_pt2e`` with the graph's own scales and
  fixed-point requantisation.

Both int8 modules run the whole test split on ``ext_vta`` (the functional simulator for the VTA
operators); the script prints the float and int8 accuracies, the share of MACs on VTA, and checks
one batch bit for bit against the llvm build of the same int8 module.

Run: ``.venv/bin/python relay_examples/digits.py [--epochs 15] [--seed 0]``
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BATCH = 64


def load_digits_split(seed: int = 0):
    """Images (N, 1, 8, 8) in [0, 1] and labels, split 2/3 train, 1/3 test (stratified)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    return train_test_split(x, digits.target, test_size=1 / 3, random_state=seed,
                            stratify=digits.target)


def make_cnn():
    """conv-BN-ReLU x2, max pool, conv-BN-ReLU, flatten, linear: 8x8 -> 10 classes."""
    from torch import nn

    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def train(x, y, epochs: int, seed: int):
    """Adam, cross-entropy, mini-batches of 32; deterministic for a seed (one thread)."""
    import torch

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    model = make_cnn()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y).long()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        model.train()
        for idx in torch.randperm(len(xt), generator=gen).split(32):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx]).backward()
            opt.step()
    return model.eval()


def batches(x, size: int = BATCH):
    """Fixed-size batches (the last one padded with zeros) and the number of real rows of each."""
    for i in range(0, len(x), size):
        chunk = x[i:i + size]
        pad = np.zeros((size - len(chunk),) + x.shape[1:], np.float32)
        yield np.concatenate([chunk, pad]), len(chunk)


def evaluate(qmodel, x, y, target):
    """Accuracy of an int8 module built for ``target`` over ``(x, y)``, and the build report."""
    import tvm
    from tvm import relax

    import vta_ext

    vm = relax.VirtualMachine(relax.build(qmodel.mod, target=target), tvm.cpu())
    report = vta_ext.last_build_report() if str(target).startswith("ext_vta") else None
    predictions = []
    for batch, n in batches(x):
        out = vm["main"](tvm.runtime.tensor(batch))[0].numpy()
        predictions.append(out[:n].argmax(1))
    return float((np.concatenate(predictions) == y).mean()), report, vm


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    import torch
    import tvm

    from models import mac_placement
    from vta_ext.quantize import op_macs, quantize_pt2e, quantize_torch, symmetric_quantizer

    x_train, x_test, y_train, y_test = load_digits_split(args.seed)
    start = time.perf_counter()
    model = train(x_train, y_train, args.epochs, args.seed)
    with torch.no_grad():
        float_acc = float((model(torch.from_numpy(x_test)).argmax(1).numpy() == y_test).mean())
    print(f"trained in {time.perf_counter() - start:.1f} s on {len(x_train)} images; "
          f"test split {len(x_test)} images")
    calibration = [b for b, _ in batches(x_train[:4 * BATCH])]

    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    exported = torch.export.export(model, (torch.from_numpy(calibration[0]),))
    prepared = prepare_pt2e(exported.module(), symmetric_quantizer(per_channel=True))
    for c in calibration:
        prepared(torch.from_numpy(c))
    flows = {"power-of-two (vta_ext.quantize)": quantize_torch(model, calibration),
             "PT2E (torchao, symmetric int8)": quantize_pt2e(convert_pt2e(prepared), calibration)}

    print(f"\n{'model':<40} {'accuracy':>9} {'vs float':>9}  MACs on VTA   bit-exact vs llvm")
    print(f"{'float32 (torch)':<40} {100 * float_acc:>8.2f} %")
    status = 0
    results = {}
    for name, qm in flows.items():
        acc, report, vm = evaluate(qm, x_test, y_test, "ext_vta")
        placed = mac_placement(op_macs(qm.mod), report)
        batch = calibration[0]
        llvm_vm = tvm.relax.VirtualMachine(tvm.relax.build(qm.mod, target="llvm"), tvm.cpu())
        equal = np.array_equal(vm["main"](tvm.runtime.tensor(batch))[0].numpy(),
                               llvm_vm["main"](tvm.runtime.tensor(batch))[0].numpy())
        status |= 0 if equal else 1
        results[name] = acc
        print(f"{'int8 ' + name:<40} {100 * acc:>8.2f} % {100 * (acc - float_acc):>+8.2f}  "
              f"{100 * placed['vta'] / placed['total']:>6.1f} %      {'yes' if equal else 'NO'}")
    worst = min(results.values())
    print(f"\nlargest drop from float: {100 * (float_acc - worst):.2f} points (bar: 1.5)")
    main.results = dict(results, float=float_acc)  # for tests
    return status


if __name__ == "__main__":
    sys.exit(main())
