"""q27's reference save_sharded / load_sharded against torch.distributed.checkpoint (DCP) saving and loading with
resharding, on gloo CPU: a sharded state of three flat tensors (the parameters, AdamW's two moments) of N float32
elements, saved on n ranks and loaded on m. DCP saves DTensors sharded over a 1-D mesh of n ranks (Shard(0):
torch.chunk's pieces) and loads them into DTensors sharded over m ranks, resharding as it reads. Per (n, m) it prints
the bytes on disk (the folder, measured after the save), the slowest rank's save and load seconds (between barriers),
the most bytes one loading rank's process read (/proc/self/io rchar, as the lab counts), that rank's slices' bytes,
and the ratios reference / DCP; both loads are checked against the saved elements (bitwise).

    .venv/bin/python benchmarks/checkpoint_vs_dcp.py [--elements 4000000] [--reshards 4:3 4:2 2:4] [--repeat 3]

It asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

NAMES = ("params", "exp_avg", "exp_avg_sq")


def _rchar() -> int:
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar"):
                return int(line.split()[1])
    return 0


def _whole(total: int, name: str):
    import torch
    g = torch.Generator().manual_seed(NAMES.index(name))
    return torch.randn(total, generator=g)


def worker(rank: int, world: int, n: int, m: int, total: int, init: str, root: str, answer: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    ref = types.ModuleType("q27_reference")
    exec(compile(Path(answer).read_text(), answer, "exec"), ref.__dict__)  # noqa: S102 - the reference answer
    save_group = dist.new_group(list(range(n)))
    load_group = dist.new_group(list(range(m)))
    wholes = {name: _whole(total, name) for name in NAMES}
    result = {}

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dist.barrier()
        return time.perf_counter() - t0

    # ours: every saving rank writes its shards (tensor_split's) and its metadata
    ours = Path(root) / "ours"
    if rank < n:
        dp = types.SimpleNamespace(group=save_group, size=n, rank=rank, ranks=list(range(n)))
        shard = torch.tensor_split(wholes["params"], n)[rank]
        params = [wholes["params"]]
        state = {"step": 3, "exp_avg": torch.tensor_split(wholes["exp_avg"], n)[rank].clone(),
                 "exp_avg_sq": torch.tensor_split(wholes["exp_avg_sq"], n)[rank].clone()}
        del shard
    result["ours_save"] = timed(lambda: ref.save_sharded(params, state, dp, ours) if rank < n else None)
    loaded: dict = {}

    def load_ours():
        if rank < m:
            before = _rchar()
            loaded.update(ref.load_sharded(ours, types.SimpleNamespace(group=load_group, size=m, rank=rank,
                                                                       ranks=list(range(m)))))
            result["ours_read"] = _rchar() - before
    result["ours_load"] = timed(load_ours)
    if rank < m:
        a = sum(t.numel() for t in torch.tensor_split(wholes["params"], m)[:rank])
        b = a + torch.tensor_split(wholes["params"], m)[rank].numel()
        result["ours_right"] = all(torch.equal(loaded[k], wholes[k][a:b]) for k in NAMES)
        result["slices"] = 3 * (b - a) * 4

    # DCP: DTensors over a mesh of n ranks saved, loaded into DTensors over a mesh of m ranks
    theirs = Path(root) / "dcp"
    # the meshes of the n saving and the m loading ranks, made on every rank (each makes a process group)
    mesh_n = DeviceMesh("cpu", list(range(n)), mesh_dim_names=("dp",))
    mesh_m = DeviceMesh("cpu", list(range(m)), mesh_dim_names=("dp",))
    if rank < n:
        sd = {k: distribute_tensor(wholes[k], mesh_n, [Shard(0)]) for k in NAMES}
    result["dcp_save"] = timed(lambda: dcp.save(sd, checkpoint_id=str(theirs), process_group=save_group)
                               if rank < n else None)
    target: dict = {}

    def load_dcp():
        if rank < m:
            target.update({k: distribute_tensor(torch.zeros(total), mesh_m, [Shard(0)]) for k in NAMES})
            before = _rchar()
            dcp.load(target, checkpoint_id=str(theirs), process_group=load_group)
            result["dcp_read"] = _rchar() - before
    result["dcp_load"] = timed(load_dcp)
    if rank < m:
        local = {k: target[k].to_local() for k in NAMES}
        size = -(-total // m)
        a, b = min(total, rank * size), min(total, (rank + 1) * size)
        result["dcp_right"] = all(torch.equal(local[k], wholes[k][a:b]) for k in NAMES)
        result["dcp_slices"] = 3 * (b - a) * 4
    Path(out, f"{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    import torch.multiprocessing as mp

    from grader.reference import reference_sources
    p = argparse.ArgumentParser()
    p.add_argument("--elements", type=int, default=4_000_001)
    p.add_argument("--reshards", nargs="*", default=["4:3", "4:2", "2:4", "3:4"])
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    answer = reference_sources()["q27"]
    total = args.elements
    print(f"q27's reference save_sharded / load_sharded against torch.distributed.checkpoint with resharding (gloo, "
          f"CPU): three tensors of N = {total:,} float32 elements ({3 * total * 4:,} B), median of {args.repeat} runs")
    print(f"{'n -> m':>7} {'disk ours':>11} {'disk DCP':>11} {'save ours':>9} {'save DCP':>9} {'load ours':>9} "
          f"{'load DCP':>9} {'read ours':>11} {'read DCP':>11} {'slices':>11} {'ok':>5} {'save o/D':>8} "
          f"{'load o/D':>8} {'read o/D':>8}")
    for spec in args.reshards:
        n, m = map(int, spec.split(":"))
        world = max(n, m)
        runs = []
        for _ in range(args.repeat):
            with tempfile.TemporaryDirectory() as tmp:
                root, out = Path(tmp) / "ck", Path(tmp) / "out"
                (root / "ours").mkdir(parents=True)
                out.mkdir()
                mp.spawn(worker, args=(world, n, m, total, f"file://{tmp}/store", str(root), answer, str(out)),
                         nprocs=world)
                ranks = [json.loads((out / f"{r}.json").read_text()) for r in range(world)]
                runs.append({"disk_ours": folder_bytes(root / "ours"), "disk_dcp": folder_bytes(root / "dcp"),
                             **{k: max(r[k] for r in ranks) for k in ("ours_save", "dcp_save", "ours_load",
                                                                      "dcp_load")},
                             "read_ours": max(r.get("ours_read", 0) for r in ranks),
                             "read_dcp": max(r.get("dcp_read", 0) for r in ranks),
                             "slices": max(r.get("slices", 0) for r in ranks),
                             "ok": all(r.get("ours_right", True) and r.get("dcp_right", True) for r in ranks)})
                shutil.rmtree(root, ignore_errors=True)
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "ok"}
        ok = all(r["ok"] for r in runs)
        print(f"{spec:>7} {med['disk_ours']:>11,.0f} {med['disk_dcp']:>11,.0f} {med['ours_save']:>9.3f} "
              f"{med['dcp_save']:>9.3f} {med['ours_load']:>9.3f} {med['dcp_load']:>9.3f} {med['read_ours']:>11,.0f} "
              f"{med['read_dcp']:>11,.0f} {med['slices']:>11,.0f} {str(ok):>5} "
              f"{med['ours_save'] / med['dcp_save']:>8.2f} {med['ours_load'] / med['dcp_load']:>8.2f} "
              f"{med['read_ours'] / max(1, med['read_dcp']):>8.2f}")


if __name__ == "__main__":
    main()
