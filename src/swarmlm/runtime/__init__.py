"""What both methods run on: checkpoints, metrics, devices, torch.distributed launches, Ctrl+C handling and
the on-disk cache. Nothing here knows SAPO or NoLoCo."""
