"""A PyTorch dispatch mode that records the operators it sees (for the tcc.torch tests that check
what goes through the dispatcher). Its own module: importing it imports torch."""

from torch.utils._python_dispatch import TorchDispatchMode


class Seen(TorchDispatchMode):
    """Records ``str(func)`` of every operator dispatched while it is active."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))
