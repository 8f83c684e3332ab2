def baseline_step(model, dataloader, device):
    batch = next(iter(dataloader)).to(device)
    output = model(batch)
    loss = output.sum()
    loss.backward()
    return output, loss
