import torch
import torch.nn.functional as F

from lab_src import pipeline_communicate


def train_pipeline(stage, data, step_fn, num_steps, lr):
    """Train this stage for num_steps steps, then evaluate on the held-out images."""
    optimizer = torch.optim.AdamW(stage.parameters(), lr=lr)   # (and no zero_grad anywhere)
    losses = []
    stage.train()
    for step in range(num_steps):
        tokens = iter(data.train_tokens(step)) if stage.is_first_stage else None
        if stage.is_last_stage:
            stage.set_labels(data.train_labels(step))          # the loss is computed here
        _, loss = step_fn(stage, tokens, data.num_microbatches)
        optimizer.step()
        if stage.is_last_stage:
            losses.append(loss)

    stage.eval()                                               # evaluation: forward only, no graph
    tokens = data.test_tokens() if stage.is_first_stage else None
    labels = data.test_labels() if stage.is_last_stage else None
    if stage.is_last_stage:
        stage.set_labels(None)                                 # the last stage returns class scores
    test_loss, correct = 0.0, 0
    with torch.no_grad():
        for mb in range(data.num_test_microbatches):
            x = pipeline_communicate("recv_forward", stage, microbatch=mb)
            if x is None:
                x = tokens[mb].to(stage.device)
            y = stage.forward(x, microbatch=mb)
            pipeline_communicate("send_forward", stage, tensor=y, microbatch=mb)
            if stage.is_last_stage:
                target = labels[mb].to(y.device)
                test_loss += float(F.cross_entropy(y, target))
                correct += int((y.argmax(dim=-1) == target).sum())
    stage.flush()
    stage.train()
    if not stage.is_last_stage:
        return None
    n = data.num_test_microbatches
    return {"losses": losses, "test_loss": test_loss / n, "test_accuracy": correct / (n * data.micro_batch_size)}
