"""torch.multiprocessing: importing it registers torch's reductions."""
from . import reductions

reductions.init_reductions()
