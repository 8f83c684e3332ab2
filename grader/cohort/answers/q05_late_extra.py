def distribute_layers(num_layers, pp_rank, pp_size):
    # the last stages take the extra layers
    base, extra = divmod(num_layers, pp_size)
    first_big = pp_size - extra
    start = pp_rank * base + max(0, pp_rank - first_big)
    count = base + (1 if pp_rank >= first_big else 0)
    return list(range(start, start + count))
