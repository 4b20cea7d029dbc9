"""torch.nn.parameter.Parameter: a leaf tensor on the same storage."""
from .._tensor import Tensor


class Parameter(Tensor):
    def __init__(self, data, requires_grad=True):
        super().__init__(data.untyped_storage(), data.dtype, data.size(),
                         data.stride(), data.storage_offset())
        self.requires_grad = requires_grad
