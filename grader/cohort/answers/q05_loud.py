print("debugging distribute_layers " + "=" * 5_000_000)


def distribute_layers(num_layers, pp_rank, pp_size):
    print(f"rank {pp_rank}: " + "." * 100_000)
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return list(range(start, start + base + (1 if pp_rank < extra else 0)))
