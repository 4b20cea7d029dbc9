/* thread.c: what each thread keeps of the allocator it last used
 * (xs_pairs_thread in types.h): its pair for the cached malloc, the
 * range of its last cached free, its counts of uses and frees. Apart from
 * pairs.c and ranges.c, which both read and write it, so that neither
 * depends on the other for it.
 */
#include "alloc/thread.h"
#include "alloc/types.h"

__thread xs_pairs_thread xs_pairs_tls;

uint64_t xs_pairs_use(void) { return ++xs_pairs_tls.uses; }
