import torch

from lab_src import PipelineStage, afab_step, make_dataloader, needs_dataloader


def predicted_bytes():
    return {"pipeline": 2 * 2 * 1 * 3 * (4 * 16 * 32 * 4), "data_parallel": 2 * (2560 + 4 * 12704 + 2176) * 4,
            "tied": 2 * 2 * 64 * 32 * 4}


def dp_pp_step(grid, cfg):
    dp, pp = grid.dp_size, grid.pp_size
    dp_rank, pp_rank = divmod(grid.rank, pp)
    pipelines = [grid.new_group([d * pp + p for p in range(pp)]) for d in range(dp)]
    dp_sets = [grid.new_group([d * pp + p for d in range(dp)]) for p in range(pp)]
    tied = [grid.new_group([d * pp, d * pp + pp - 1]) for d in range(dp)] if cfg.tie_embeddings and pp > 1 else []
    mbs = cfg.global_batch_size // (dp * cfg.num_microbatches)
    stage = PipelineStage(cfg, pp_rank, pp, mbs, grid.device, pipelines[dp_rank])
    data = iter(make_dataloader(cfg, mbs, dp_rank=dp_rank)) if needs_dataloader(pp_rank, pp) else None
    outputs, loss = afab_step(stage, data, cfg.num_microbatches)
    if tied and stage.tied_embedding is not None:
        grid.all_reduce(stage.tied_embedding.grad, tied[dp_rank], "tied")
    if dp > 1:
        for p in stage.parameters():
            grid.all_reduce(p.grad, dp_sets[pp_rank], "dp", op="avg")
    return stage, outputs, loss
