/*
 * verbsabi: the libibverbs ABI that every libibverbs.so.1 of this project
 * exports — the drop-in over the Go driver (ibverbs/) and the bench's
 * software HCA (qemu/softverbs/). One home for the symbol map
 * (libibverbs.map), the provider-private interface rdma-core's provider
 * libraries import (private.c), the parts of the API that need no
 * device (common.c: names of enum values, rates, fork and sysfs helpers,
 * address handles from a completion, the device list's names, the one
 * port's one P_Key), and the librdmacm stand-in both ship (rdmacm.c,
 * librdmacm.map). Each library compiles these files
 * beside its own and links with the map.
 */
#ifndef VERBSABI_ABI_H
#define VERBSABI_ABI_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <infiniband/verbs.h>

/* verbs.h turns some exported names into macros; the libraries define the
 * real ones. */
#undef ibv_get_device_list
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova

/* A symbol the library exports (the map then gives it its version). */
#define ABI_EXPORT __attribute__((visibility("default")))

#endif
