def activation_shape(cfg, micro_batch_size):
    # the output of the model is (batch, seq, vocab), so that must be what travels
    return (micro_batch_size, cfg.seq_len, cfg.vocab_size)
