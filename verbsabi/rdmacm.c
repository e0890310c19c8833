/*
 * librdmacm stand-in, beside each libibverbs.so.1 of the project: the
 * system's librdmacm imports libibverbs symbols neither library exports
 * (ibv_query_ece, ibv_set_ece at IBVERBS_1.10), so a program linking it
 * (perftest, QEMU) loads this one instead. QEMU imports 19 of these
 * calls, for RDMA live migration only; perftest imports the same 19 plus
 * rdma_create_qp_ex and rdma_reject, for its -R (RDMA CM) mode only.
 * There is no connection manager, so each one fails with ENOSYS
 * (returning -1, or NULL for pointers) without side effects.
 * Opaque pointer types replace the librdmacm structures: nothing here
 * looks inside them.
 */
#include <errno.h>
#include <stddef.h>

#define CM_EXPORT __attribute__((visibility("default")))

static int cm_fail(void)
{
	errno = ENOSYS;
	return -1;
}

CM_EXPORT void *rdma_create_event_channel(void)
{
	errno = ENOSYS;
	return NULL;
}

CM_EXPORT void rdma_destroy_event_channel(void *channel) { (void)channel; }

CM_EXPORT int rdma_create_id(void *channel, void **id, void *context, int ps)
{
	(void)channel; (void)context; (void)ps;
	if (id)
		*id = NULL;
	return cm_fail();
}

CM_EXPORT int rdma_destroy_id(void *id) { (void)id; return cm_fail(); }

CM_EXPORT int rdma_bind_addr(void *id, void *addr)
{
	(void)id; (void)addr;
	return cm_fail();
}

CM_EXPORT int rdma_resolve_addr(void *id, void *src, void *dst, int timeout_ms)
{
	(void)id; (void)src; (void)dst; (void)timeout_ms;
	return cm_fail();
}

CM_EXPORT int rdma_resolve_route(void *id, int timeout_ms)
{
	(void)id; (void)timeout_ms;
	return cm_fail();
}

CM_EXPORT int rdma_create_qp(void *id, void *pd, void *init)
{
	(void)id; (void)pd; (void)init;
	return cm_fail();
}

CM_EXPORT int rdma_create_qp_ex(void *id, void *init_ex)
{
	(void)id; (void)init_ex;
	return cm_fail();
}

CM_EXPORT void rdma_destroy_qp(void *id) { (void)id; }

CM_EXPORT int rdma_connect(void *id, void *param)
{
	(void)id; (void)param;
	return cm_fail();
}

CM_EXPORT int rdma_listen(void *id, int backlog)
{
	(void)id; (void)backlog;
	return cm_fail();
}

CM_EXPORT int rdma_accept(void *id, void *param)
{
	(void)id; (void)param;
	return cm_fail();
}

CM_EXPORT int rdma_reject(void *id, const void *private_data,
			  unsigned char private_data_len)
{
	(void)id; (void)private_data; (void)private_data_len;
	return cm_fail();
}

CM_EXPORT int rdma_disconnect(void *id) { (void)id; return cm_fail(); }

CM_EXPORT int rdma_get_cm_event(void *channel, void **event)
{
	(void)channel;
	if (event)
		*event = NULL;
	return cm_fail();
}

CM_EXPORT int rdma_ack_cm_event(void *event) { (void)event; return cm_fail(); }

CM_EXPORT const char *rdma_event_str(int event)
{
	(void)event;
	return "RDMA_CM_EVENT_UNSUPPORTED";
}

CM_EXPORT int rdma_set_option(void *id, int level, int optname, void *optval,
			      size_t optlen)
{
	(void)id; (void)level; (void)optname; (void)optval; (void)optlen;
	return cm_fail();
}

CM_EXPORT int rdma_getaddrinfo(const char *node, const char *service,
			       const void *hints, void **res)
{
	(void)node; (void)service; (void)hints;
	if (res)
		*res = NULL;
	return cm_fail();
}

CM_EXPORT void rdma_freeaddrinfo(void *res) { (void)res; }
