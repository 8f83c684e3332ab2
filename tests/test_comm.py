"""lab_src/comm, the lab's own torch.distributed: the mesh's arithmetic, its groups made for real on gloo, the
collective recorder on an all-to-all over a mesh dimension, and the typed settings of a case."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from lab_src.comm.mesh import Mesh
from lab_src.harness.case import Case
from lab_src.harness.settings import settings_of
from lab_src.pipeline.config import LabConfig


def test_a_mesh_lays_ranks_out_row_major_in_the_order_its_dimensions_are_named():
    mesh = Mesh({"dp": 2, "pp": 3}, rank=4, timeout_s=5)
    assert mesh.size == 6 and mesh.coords() == {"dp": 1, "pp": 1}
    assert mesh.rank_at(dp=1, pp=1) == 4
    assert mesh.members("pp") == [3, 4, 5] and mesh.members("dp") == [1, 4]
    assert mesh.all_members("pp") == [[0, 1, 2], [3, 4, 5]]
    assert mesh.all_members("dp") == [[0, 3], [1, 4], [2, 5]]
    assert mesh.neighbours("pp") == (3, 5) and mesh.neighbours("dp") == (1, 1)
    # q18's tensor parallel inside pipeline stages: stage s is ranks s, s + p, ... (tp varies slowest)
    tp = Mesh({"tp": 2, "pp": 2}, rank=3, timeout_s=5)
    assert tp.coord("tp") == 1 and tp.coord("pp") == 1 and tp.members("tp") == [1, 3]
    # a dimension named later varies faster: picotron's (dp, pp, cp, tp)
    four = Mesh({"dp": 2, "cp": 2, "ep": 2}, rank=5, timeout_s=5)
    assert four.coords() == {"dp": 1, "cp": 0, "ep": 1} and four.members("cp") == [5, 7]


@pytest.mark.parametrize("dims, rank", [({"dp": 0}, 0), ({"dp": 2.0}, 0), ({}, 0), ({"dp": 2}, 2), ({"dp": True}, 0)])
def test_a_mesh_refuses_degrees_that_are_not_whole_numbers_or_a_rank_outside_it(dims, rank):
    with pytest.raises(ValueError):
        Mesh(dims, rank=rank, timeout_s=5)


RANK = """
import json, os, sys
import torch
import torch.distributed as dist
from lab_src.comm import collectives
from lab_src.comm.mesh import Mesh
from lab_src.pipeline import trace
rank = int(sys.argv[1])
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=4)
collectives.install()
mesh = Mesh({"dp": 2, "pp": 2}, rank, timeout_s=30).build("pp", "dp")
mesh.add("tied", [[0, 1], [2, 3]])
seen = {name: dist.get_process_group_ranks(mesh.group(name)) for name in ("pp", "dp", "tied")}
tracer = trace.Tracer(rank)
with trace.tracing(tracer):
    sent = torch.arange(4, dtype=torch.float32) + 10 * rank
    got = torch.empty(4)
    dist.all_to_all_single(got, sent, group=mesh.group("dp"))
    total = torch.ones(3)
    dist.all_reduce(total, group=mesh.group("pp"))
mesh.destroy()
print(json.dumps([seen, got.tolist(), total.tolist(),
                  [[e.kind, e.bytes, list(e.group)] for e in tracer.events if e.is_collective]]))
dist.destroy_process_group()
"""


def test_a_meshs_groups_are_real_and_the_recorder_names_an_all_to_all_over_one_of_them():
    """Four gloo ranks as a 2 x 2 (dp, pp) mesh: each group holds the ranks the arithmetic says; an all-to-all over
    dp moves each half where it belongs and is recorded as "all_to_all" over its group, an all-reduce over pp too."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True) for r in range(4)]
    results = {}
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err[-2000:]
            results[r] = json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for rank, (seen, got, total, events) in results.items():
        mesh = Mesh({"dp": 2, "pp": 2}, rank, timeout_s=5)
        assert seen == {"pp": mesh.members("pp"), "dp": mesh.members("dp"), "tied": mesh.members("pp")}
        peer = mesh.members("dp")
        position = peer.index(rank)
        assert got == [10 * peer[0] + 2 * position, 10 * peer[0] + 2 * position + 1,
                       10 * peer[1] + 2 * position, 10 * peer[1] + 2 * position + 1]
        assert total == [2.0, 2.0, 2.0]
        assert events == [["all_to_all", 16, peer], ["all_reduce", 12, mesh.members("pp")]]


def test_a_cases_settings_are_its_kinds_class_and_a_key_it_does_not_declare_is_named():
    cfg = LabConfig(num_stages=2)
    s = settings_of(Case("buckets", "q20", cfg, settings={"cap": 1024}))
    assert (s.cap, s.steps, list(s.mlp_caps), list(s.freeze)) == (1024, 3, [], [])
    with pytest.raises(TypeError, match="kind 'buckets' has no setting step: its settings .* cap, steps"):
        settings_of(Case("buckets", "q20", cfg, settings={"cap": 1024, "step": 2}))
    with pytest.raises(TypeError, match="needs the setting cap"):
        settings_of(Case("buckets", "q20", cfg, settings={}))
    with pytest.raises(TypeError, match="kind 'p2p' has no setting steps: its settings .* are none"):
        settings_of(Case("p2p", "q11", cfg, settings={"steps": 3}))
    assert settings_of(Case("zero", "q21", cfg)).steps == settings_of(Case("fsdp", "q22", cfg)).steps == 3
