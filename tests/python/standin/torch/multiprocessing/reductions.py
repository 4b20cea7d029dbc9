"""torch/multiprocessing/reductions.py's parts for CUDA tensors and
storages: reduce_tensor takes sparse layouts apart first (here: a marker
rebuild naming the layout), else reaches storage._share_cuda_() (refused
for a pluggable allocator), reduce_storage refuses CUDA storages, and
init_reductions registers them on ForkingPickler as torch does."""
from multiprocessing.reduction import ForkingPickler

import torch


class StorageWeakRef:
    __slots__ = ["cdata", "_free_weak_ref"]

    def __init__(self, storage):
        self.cdata = storage._weak_ref()
        self._free_weak_ref = torch.UntypedStorage._free_weak_ref

    def expired(self):
        return torch.UntypedStorage._expired(self.cdata)

    def __del__(self):
        self._free_weak_ref(self.cdata)


def rebuild_sparse_tensor(layout_name):
    raise NotImplementedError("stand-in: sparse tensors are not modelled")


def reduce_sparse_tensor(tensor):
    """torch's own takes the tensor apart into its strided index and value
    tensors; the stand-in only names the layout it was given."""
    return (rebuild_sparse_tensor, (tensor.layout.name,))


def reduce_tensor(tensor):
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError(
            "Cowardly refusing to serialize non-leaf tensor which "
            "requires_grad, since autograd does not support crossing process "
            "boundaries.  If you just want to transfer the data, call "
            "detach() on the tensor before serializing (e.g., putting it on "
            "the queue).")
    if tensor.layout in (torch.sparse_coo, torch.sparse_csr,
                         torch.sparse_bsr, torch.sparse_csc,
                         torch.sparse_bsc):
        return reduce_sparse_tensor(tensor)
    storage = tensor.untyped_storage()
    if storage.device.type == "cuda":
        storage._share_cuda_()
    raise NotImplementedError("stand-in: CPU tensors are not modelled")


def reduce_storage(storage):
    if storage.is_cuda:
        raise RuntimeError(
            "Cannot pickle CUDA storage; try pickling a CUDA tensor instead")
    raise NotImplementedError("stand-in: CPU storages are not modelled")


def init_reductions():
    for t in torch._storage_classes:
        if t.__name__ == "UntypedStorage":
            ForkingPickler.register(t, reduce_storage)
    for t in torch._tensor_classes:
        ForkingPickler.register(t, reduce_tensor)
    ForkingPickler.register(torch.Tensor, reduce_tensor)
    ForkingPickler.register(torch.nn.parameter.Parameter, reduce_tensor)
