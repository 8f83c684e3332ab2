def needs_dataloader(pp_rank, pp_size):
    # every rank trains, so every rank reads data
    return True
