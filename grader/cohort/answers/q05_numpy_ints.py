import numpy as np


def distribute_layers(num_layers, pp_rank, pp_size):
    sizes = np.full(pp_size, num_layers // pp_size) + (np.arange(pp_size) < num_layers % pp_size)
    start = int(sizes[:pp_rank].sum())
    return list(np.arange(start, start + sizes[pp_rank]))
