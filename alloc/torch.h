/* torch.h: what the tests need of alloc/torch.c beyond include/xseg.h. */
#ifndef XS_ALLOC_TORCH_H
#define XS_ALLOC_TORCH_H

/* Destroys every allocator the xseg_torch_* entry points created, so that a
   test ends with nothing live; the next entry point creates them again. Not
   for use while other threads call them. */
void xs_torch_destroy_all(void);

#endif
