/* The provider-private interface rdma-core's provider libraries import
 * (verbsabi/). */
#include "../verbsabi/private.c"
