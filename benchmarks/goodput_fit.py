"""Throughput-model fit accuracy on the bundled Pollux profiles (issue 11, item 1).

For each model (cifar10, bert, imagenet, ncf; ``cost_models/data/pollux``, Apache-2.0, from the Pollux
authors): fit on ``scalability.csv`` plus every other row of ``placements.csv`` (rows 0, 2, 4, ... in
file order), predict the step time of the other placement rows, and report the relative error
|predicted / measured - 1| (median, p90, max; also by kind of placement: one GPU, one node with several
GPUs, several nodes) and the error of the predicted speedup over one GPU at the same per-GPU batch,
K * T(1 GPU, m) / T(N nodes, K GPUs, m), against the measured one (the one-GPU step times are the
profile's ``placement = 1`` rows).

Three fits side by side:
  spotrain      ``ThroughputModel.fit`` as shipped (robust log-space fit; eight parameters where the rows
                place ``delta_n``, else seven)
  spotrain-7    the same fit with Pollux's seven parameters only (``contention_term=False``)
  adaptdl-ref   AdaptDL's ``fit_perf_params`` method re-implemented here (its model, its objective: RMSE
                of log step time + RMSE of log compute time + its two regularisers, L-BFGS-B from its
                starting point; finite-difference gradients where AdaptDL uses autograd)
and AdaptDL's own published figures on this split (issue 11: medians 6.8 / 4.2 / 4.9 / 7.0 %).

A second protocol (issue 20), what the controller does when it values allocations nobody measured: fit on
``scalability.csv`` alone (6-16 nodes, no one-node rows) and predict every row of ``placements.csv``
(1-4 nodes). There the shipped fit must be no worse than the seven-parameter one (it leaves ``delta_n``
out when the rows cannot place it; ``cost_models/throughput.py``).

    python benchmarks/goodput_fit.py [--out FILE.json] [--data-dir DIR]

``--data-dir`` reads the profiles from another folder of Pollux's layout (default: the bundled ones).

Prints a table and, as the last line, one JSON object with every figure (also written to ``--out``).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from scipy.optimize import Bounds, minimize

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cost_models.goodput import ThroughputModel  # noqa: E402
from cost_models.scaling import DATA_DIR, POLLUX_MODELS  # noqa: E402

ADAPTDL_MEDIAN_PCT = {"cifar10": 6.8, "bert": 4.2, "imagenet": 4.9, "ncf": 7.0}
TARGET_P90_PCT = 20.0
Rows = dict[str, np.ndarray]
Predictor = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _read(path: Path) -> Rows:
    rows = list(csv.DictReader(path.read_text().splitlines()))
    out: dict[str, list[float]] = {"nodes": [], "replicas": [], "local_bsz": [], "step_time": [], "sync_time": []}
    for r in rows:
        if "placement" in r:
            digits = [int(c) for c in r["placement"]]
            out["nodes"].append(len(digits))
            out["replicas"].append(sum(digits))
        else:
            out["nodes"].append(int(r["num_nodes"]))
            out["replicas"].append(int(r["num_replicas"]))
        for key in ("local_bsz", "step_time", "sync_time"):
            out[key].append(float(r[key]))
    return {k: np.array(v, dtype=np.float64) for k, v in out.items()}


def split(name: str, data_dir: Path = DATA_DIR) -> tuple[Rows, Rows, Rows]:
    """(train, test, placements): scalability + even placement rows, odd placement rows, all placements."""
    scal = _read(data_dir / name / "scalability.csv")
    place = _read(data_dir / name / "placements.csv")
    train = {k: np.concatenate([scal[k], place[k][0::2]]) for k in scal}
    test = {k: place[k][1::2] for k in place}
    return train, test, place


def split_scalability_only(name: str, data_dir: Path = DATA_DIR) -> tuple[Rows, Rows, Rows]:
    """(train, test, placements): scalability rows (multi-node only), every placement row, all placements."""
    place = _read(data_dir / name / "placements.csv")
    return _read(data_dir / name / "scalability.csv"), place, place


def fit_spotrain(train: Rows, *, contention_term: bool = True) -> Predictor:
    model = ThroughputModel.fit(train["nodes"], train["replicas"], train["local_bsz"], train["step_time"],
                                train["sync_time"], contention_term=contention_term)
    return lambda n, k, m: np.asarray(model.step_time(n, k, m))


def _adaptdl_predict(x: np.ndarray, n: np.ndarray, k: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma = x
    compute = alpha_c + beta_c * m
    conds = [n > 1, k > 1]
    network = np.select(conds, [alpha_n, alpha_r], 1e-8) + np.select(conds, [beta_n, beta_r], 1e-8) * np.maximum(k - 2, 1e-8)
    return (compute ** gamma + network ** gamma) ** (1 / gamma), compute


def fit_adaptdl_reference(train: Rows) -> Predictor:
    """AdaptDL's fit_perf_params method (see the module docstring), for a side-by-side figure."""
    n, k, m, t = train["nodes"], train["replicas"], train["local_bsz"], train["step_time"]
    compute = t - train["sync_time"]

    def objective(x: np.ndarray) -> float:
        step, comp = _adaptdl_predict(x, n, k, m)
        err = np.sqrt(np.mean((np.log(step) - np.log(t)) ** 2)) + np.sqrt(np.mean((np.log(comp) - np.log(compute)) ** 2))
        reg = 1e-3 * (x[6] - 1) ** 2 + 1e-2 * ((x[3] / x[2]) ** 2 + (x[5] / x[4]) ** 2)
        return float(err + reg)

    x0 = np.array([1e-1, 1e-2] * 3 + [1.0 + 1e-3])
    bounds = Bounds([1e-8] * 6 + [1.0], [np.inf] * 6 + [10.0], keep_feasible=True)
    x = minimize(objective, x0, bounds=bounds).x
    return lambda n_, k_, m_: _adaptdl_predict(x, n_, k_, m_)[0]


def _pct(v: np.ndarray, q: float) -> float:
    return round(100.0 * float(np.percentile(v, q)), 2) if v.size else float("nan")


def score(predict: Predictor, test: Rows, place: Rows) -> dict[str, Any]:
    n, k, m, t = test["nodes"], test["replicas"], test["local_bsz"], test["step_time"]
    rel = np.abs(predict(n, k, m) / t - 1.0)
    kinds = {"one_gpu": k == 1, "one_node": (n == 1) & (k > 1), "multi_node": n > 1}
    # Speedup over one GPU at the same per-GPU batch, on held-out rows with several GPUs.
    single = place["replicas"] == 1
    t1 = dict(zip(place["local_bsz"][single], place["step_time"][single]))
    sel = (k > 1) & np.isin(m, list(t1))
    meas_t1 = np.array([t1[b] for b in m[sel]])
    measured = k[sel] * meas_t1 / t[sel]
    predicted = k[sel] * predict(np.ones(sel.sum()), np.ones(sel.sum()), m[sel]) / predict(n[sel], k[sel], m[sel])
    sp_rel = np.abs(predicted / measured - 1.0)
    return {
        "rows": int(t.size), "median_pct": _pct(rel, 50), "p90_pct": _pct(rel, 90), "max_pct": _pct(rel, 100),
        "by_kind_median_pct": {kind: _pct(rel[mask], 50) for kind, mask in kinds.items()},
        "speedup_rows": int(sel.sum()), "speedup_median_pct": _pct(sp_rel, 50), "speedup_p90_pct": _pct(sp_rel, 90),
    }


PROTOCOLS = {
    "current": (split, "scalability + placements[0::2] -> placements[1::2]"),
    "scalability_only": (split_scalability_only, "scalability -> placements"),
}
# The shipped fit may trail the seven-parameter one by this much (points of median) on the scalability-only
# protocol: optimizer noise, not a model difference (there the two fit the same parameters).
NO_WORSE_TOL_PCT = 0.05


def run(data_dir: Path = DATA_DIR) -> dict[str, dict[str, dict[str, Any]]]:
    """{protocol: {model: {fit label: score, ...}}} for every bundled model."""
    fits: dict[str, Callable[[Rows], Predictor]] = {
        "spotrain": fit_spotrain,
        "spotrain-7": lambda tr: fit_spotrain(tr, contention_term=False),
        "adaptdl-ref": fit_adaptdl_reference,
    }
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for protocol, (splitter, _) in PROTOCOLS.items():
        results = out.setdefault(protocol, {})
        for name in POLLUX_MODELS:
            train, test, place = splitter(name, data_dir)
            results[name] = {"train_rows": int(train["step_time"].size),
                             "adaptdl_published_median_pct": ADAPTDL_MEDIAN_PCT[name] if protocol == "current" else None}
            for label, fit in fits.items():
                t0 = time.perf_counter()
                predict = fit(train)
                results[name][label] = {**score(predict, test, place), "fit_s": round(time.perf_counter() - t0, 3)}
    return out


def _print_table(protocol: str, results: dict[str, dict[str, Any]]) -> None:
    print(f"protocol {protocol}: {PROTOCOLS[protocol][1]}")
    print(f"{'model':9s} {'fit':12s} {'median %':>9s} {'p90 %':>7s} {'max %':>7s} {'1gpu':>6s} {'1node':>6s} {'multi':>6s}"
          f" {'speedup med %':>14s} {'speedup p90 %':>14s} {'AdaptDL pub.':>13s}")
    for name, res in results.items():
        for label in ("spotrain", "spotrain-7", "adaptdl-ref"):
            r = res[label]
            kinds = r["by_kind_median_pct"]
            pub = res["adaptdl_published_median_pct"]
            pub_s = f"{pub:.1f}" if label == "spotrain" and pub is not None else ""
            print(f"{name:9s} {label:12s} {r['median_pct']:9.2f} {r['p90_pct']:7.1f} {r['max_pct']:7.1f} {kinds['one_gpu']:6.1f}"
                  f" {kinds['one_node']:6.1f} {kinds['multi_node']:6.1f} {r['speedup_median_pct']:14.2f}"
                  f" {r['speedup_p90_pct']:14.1f} {pub_s:>13s}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, help="also write the JSON figures here")
    ap.add_argument("--data-dir", type=Path, default=DATA_DIR, help="folder of Pollux profiles (default: bundled)")
    args = ap.parse_args()
    for name in POLLUX_MODELS:
        for csv_name in ("scalability.csv", "placements.csv"):
            if not (args.data_dir / name / csv_name).is_file():
                sys.exit(f"--data-dir: {args.data_dir / name / csv_name} not found")
    by_protocol = run(args.data_dir)
    for protocol, results in by_protocol.items():
        _print_table(protocol, results)
        print()
    ours = {name: res["spotrain"] for name, res in by_protocol["current"].items()}
    meets = all(r["median_pct"] <= ADAPTDL_MEDIAN_PCT[name] and r["p90_pct"] <= TARGET_P90_PCT for name, r in ours.items())
    print(f"target (median <= AdaptDL's published, p90 <= {TARGET_P90_PCT:g} %): {'met' if meets else 'NOT met'}")
    scal = by_protocol["scalability_only"]
    never_worse = all(res["spotrain"]["median_pct"] <= res["spotrain-7"]["median_pct"] + NO_WORSE_TOL_PCT
                      for res in scal.values())
    print(f"scalability-only: shipped fit's median <= the 7-parameter fit's on every model: {'yes' if never_worse else 'NO'}")
    out = {"benchmark": "goodput_fit", "data_dir": str(args.data_dir),
           "split": PROTOCOLS["current"][1], "target_met": meets, "models": by_protocol["current"],
           "scalability_only_split": PROTOCOLS["scalability_only"][1], "scalability_only": scal,
           "scalability_only_never_worse_than_7": never_worse}
    text = json.dumps(out, sort_keys=True)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
