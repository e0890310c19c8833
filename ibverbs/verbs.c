/*
 * The libibverbs entry points of the drop-in: each allocates or frees the
 * C structure of its object and calls into Go (glue.go) for the verb.
 * The data path (post, poll, arm) is reached through ibv_context.ops and
 * crosses into Go once per call.
 */
#include "dropin.h"
#include "_cgo_export.h"

#include <endian.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VF(p, type) ((struct type *)(void *)(p))

static struct vf_device vf_devices[VF_MAX_DEVICES];
static pthread_mutex_t vf_list_lock = PTHREAD_MUTEX_INITIALIZER;

static int vf_fail(int neg)
{
	errno = -neg;
	return -1;
}

/* ---- devices ---- */

ABI_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list;
	int n;

	pthread_mutex_lock(&vf_list_lock);
	n = vfgoDeviceList(vf_devices, VF_MAX_DEVICES);
	pthread_mutex_unlock(&vf_list_lock);
	if (n < 0) {
		errno = -n;
		return NULL;
	}
	list = calloc((size_t)n + 1, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	for (int i = 0; i < n; i++)
		list[i] = &vf_devices[i].ibv;
	if (num_devices)
		*num_devices = n;
	return list;
}

ABI_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return device ? VF(device, vf_device)->index : -1;
}

ABI_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	(void)device;
	return 0; /* known once open: ibv_query_device's node_guid */
}

/* ---- contexts ---- */

static int vf_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	return vfgoPostSend(VF(qp, vf_qp)->id, (struct vf_send_wr *)wr, (struct vf_send_wr **)bad);
}

static int vf_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return vfgoPostRecv(VF(qp, vf_qp)->id, wr, bad);
}

static int vf_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	return vfgoPostSRQRecv(VF(srq, vf_srq)->id, wr, bad);
}

static int vf_poll_cq(struct ibv_cq *cq, int ne, struct ibv_wc *wc)
{
	return vfgoPollCQ(VF(cq, vf_cq)->id, ne, (struct vf_wc *)wc);
}

/* The counting data path of VFRDMA_CALLS=1: the same calls, counted with
 * relaxed atomics (threads may share a context). */
#define VF_COUNT(field, n) __atomic_fetch_add(&field, (unsigned long)(n), __ATOMIC_RELAXED)

static struct vf_context *to_vctx(struct ibv_context *c);

static int vf_post_send_counted(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
	struct vf_calls *k = to_vctx(qp->context)->calls;
	unsigned long n = 0;

	for (struct ibv_send_wr *w = wr; w; w = w->next)
		n++;
	VF_COUNT(k->post_send, 1);
	VF_COUNT(k->send_wrs, n);
	return vf_post_send(qp, wr, bad);
}

static int vf_post_recv_counted(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
	struct vf_calls *k = to_vctx(qp->context)->calls;
	unsigned long n = 0;

	for (struct ibv_recv_wr *w = wr; w; w = w->next)
		n++;
	VF_COUNT(k->post_recv, 1);
	VF_COUNT(k->recv_wrs, n);
	return vf_post_recv(qp, wr, bad);
}

static int vf_poll_cq_counted(struct ibv_cq *cq, int ne, struct ibv_wc *wc)
{
	struct vf_calls *k = to_vctx(cq->context)->calls;
	int r = vf_poll_cq(cq, ne, wc);

	VF_COUNT(k->poll, 1);
	if (r == 0)
		VF_COUNT(k->empty_polls, 1);
	else if (r > 0)
		VF_COUNT(k->completions, r);
	return r;
}

static int vf_req_notify_cq(struct ibv_cq *cq, int solicited_only)
{
	return vfgoReqNotify(VF(cq, vf_cq)->id, solicited_only);
}

static int vf_req_notify_cq_counted(struct ibv_cq *cq, int solicited_only)
{
	VF_COUNT(to_vctx(cq->context)->calls->arms, 1);
	return vf_req_notify_cq(cq, solicited_only);
}

static struct vf_context *to_vctx(struct ibv_context *c)
{
	return (struct vf_context *)((char *)c - offsetof(struct vf_context, v.context));
}

static int vf_query_port_ex(struct ibv_context *context, uint8_t port_num,
			    struct ibv_port_attr *attr, size_t len)
{
	int r = vfgoQueryPort(to_vctx(context)->id, port_num, attr, len);
	return r < 0 ? -r : 0;
}

static int vf_query_device_ex(struct ibv_context *context,
			      const struct ibv_query_device_ex_input *input,
			      struct ibv_device_attr_ex *attr, size_t attr_size)
{
	int r;

	if (input && input->comp_mask)
		return EINVAL;
	if (attr_size < sizeof(attr->orig_attr))
		return EINVAL;
	memset(attr, 0, attr_size < sizeof(*attr) ? attr_size : sizeof(*attr));
	r = vfgoQueryDevice(to_vctx(context)->id, &attr->orig_attr);
	return r < 0 ? -r : 0;
}

ABI_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct vf_context *c;
	int id, fd;

	if (!device) {
		errno = EINVAL;
		return NULL;
	}
	id = vfgoOpen(VF(device, vf_device)->index);
	if (id < 0) {
		errno = -id;
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		vfgoClose(id);
		errno = ENOMEM;
		return NULL;
	}
	c->id = id;
	c->v.sz = sizeof(struct verbs_context);
	c->v.query_port = vf_query_port_ex;
	c->v.query_device_ex = vf_query_device_ex;
	fd = vfgoAsyncFD(id);
	c->v.context.device = device;
	c->v.context.cmd_fd = -1;
	c->v.context.async_fd = fd;
	c->v.context.num_comp_vectors = 1;
	c->v.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&c->v.context.mutex, NULL);
	c->v.context.ops.poll_cq = vf_poll_cq;
	c->v.context.ops.req_notify_cq = vf_req_notify_cq;
	c->v.context.ops.post_send = vf_post_send;
	c->v.context.ops.post_recv = vf_post_recv;
	c->v.context.ops.post_srq_recv = vf_post_srq_recv;
	{
		const char *v = getenv("VFRDMA_CALLS");

		if (v && *v && strcmp(v, "0") != 0 && (c->calls = calloc(1, sizeof(*c->calls)))) {
			c->v.context.ops.poll_cq = vf_poll_cq_counted;
			c->v.context.ops.post_send = vf_post_send_counted;
			c->v.context.ops.post_recv = vf_post_recv_counted;
			c->v.context.ops.req_notify_cq = vf_req_notify_cq_counted;
		}
	}
	return &c->v.context;
}

ABI_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct vf_context *c;
	int r;

	if (!context)
		return EINVAL;
	c = to_vctx(context);
	if (c->calls) {
		struct vf_calls *k = c->calls;

		fprintf(stderr, "vfrdma: %s: calls: post_send %lu (%lu WRs), post_recv %lu (%lu WRs), "
			"poll_cq %lu (%lu empty, %lu completions), req_notify_cq %lu\n", ibv_get_device_name(context->device),
			k->post_send, k->send_wrs, k->post_recv, k->recv_wrs, k->poll, k->empty_polls, k->completions, k->arms);
		free(k);
	}
	r = vfgoClose(c->id);
	pthread_mutex_destroy(&context->mutex);
	free(c);
	return r < 0 ? -r : 0;
}

/* ---- queries ---- */

ABI_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *attr)
{
	int r;

	if (!context || !attr)
		return EINVAL;
	r = vfgoQueryDevice(to_vctx(context)->id, attr);
	return r < 0 ? -r : 0;
}

/* The exported symbol takes the old, shorter port structure: everything
 * up to and including 'flags'. */
ABI_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			      struct _compat_ibv_port_attr *out)
{
	int r;

	if (!context || !out)
		return EINVAL;
	r = vfgoQueryPort(to_vctx(context)->id, port_num, out,
			  offsetof(struct ibv_port_attr, flags) + sizeof(((struct ibv_port_attr *)0)->flags));
	return r < 0 ? -r : 0;
}

ABI_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num,
			     int index, union ibv_gid *gid)
{
	int r;

	if (!context || !gid) {
		errno = EINVAL;
		return -1;
	}
	r = vfgoQueryGID(to_vctx(context)->id, port_num, index, gid);
	return r < 0 ? vf_fail(r) : 0;
}

ABI_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
				  unsigned int index, unsigned int *type)
{
	int len = 0, v2;

	if (!context || !type || port_num != 1) {
		errno = EINVAL;
		return -1;
	}
	v2 = vfgoGIDInfo(to_vctx(context)->id, &len);
	if (v2 < 0 || index >= (unsigned int)len) {
		errno = EINVAL;
		return -1;
	}
	*type = v2 ? 1 : 0; /* IBV_GID_TYPE_SYSFS_ROCE_V2 : _ROCE_V1 */
	return 0;
}

static int vf_gid_entry(struct ibv_context *context, uint32_t index, struct ibv_gid_entry *e, int v2)
{
	union ibv_gid gid;
	static const union ibv_gid zero;
	int r = vfgoQueryGID(to_vctx(context)->id, 1, (int)index, &gid);

	if (r < 0)
		return -r;
	if (memcmp(&gid, &zero, sizeof(gid)) == 0)
		return ENODATA;
	e->gid = gid;
	e->gid_index = index;
	e->port_num = 1;
	e->gid_type = v2 ? IBV_GID_TYPE_ROCE_V2 : IBV_GID_TYPE_ROCE_V1;
	e->ndev_ifindex = 0;
	return 0;
}

ABI_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
				 uint32_t gid_index, struct ibv_gid_entry *entry,
				 uint32_t flags, size_t entry_size)
{
	int len = 0, v2;

	if (!context || !entry || flags || port_num != 1 || entry_size < sizeof(*entry))
		return EINVAL;
	v2 = vfgoGIDInfo(to_vctx(context)->id, &len);
	if (v2 < 0 || gid_index >= (uint32_t)len)
		return EINVAL;
	memset(entry, 0, entry_size);
	return vf_gid_entry(context, gid_index, entry, v2);
}

ABI_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context,
					struct ibv_gid_entry *entries,
					size_t max_entries, uint32_t flags,
					size_t entry_size)
{
	int len = 0, v2;
	size_t n = 0;

	if (!context || (!entries && max_entries) || flags || entry_size < sizeof(*entries))
		return -EINVAL;
	v2 = vfgoGIDInfo(to_vctx(context)->id, &len);
	if (v2 < 0)
		return -EINVAL;
	for (int i = 0; i < len; i++) {
		struct ibv_gid_entry e;

		if (vf_gid_entry(context, (uint32_t)i, &e, v2))
			continue;
		if (n == max_entries)
			return -EINVAL;
		memset((char *)entries + n * entry_size, 0, entry_size);
		memcpy((char *)entries + n * entry_size, &e, sizeof(e));
		n++;
	}
	return (ssize_t)n;
}

/* ---- protection domains, memory regions, address handles ---- */

ABI_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct vf_pd *pd;
	uint32_t handle = 0;
	int id;

	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	id = vfgoAllocPD(to_vctx(context)->id, &handle);
	if (id < 0) {
		errno = -id;
		return NULL;
	}
	pd = calloc(1, sizeof(*pd));
	if (!pd) {
		vfgoDeallocPD(id);
		errno = ENOMEM;
		return NULL;
	}
	pd->id = id;
	pd->ibv.context = context;
	pd->ibv.handle = handle;
	return &pd->ibv;
}

ABI_EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	int r;

	if (!pd)
		return EINVAL;
	r = vfgoDeallocPD(VF(pd, vf_pd)->id);
	if (r < 0)
		return -r;
	free(pd);
	return 0;
}

static struct ibv_mr *vf_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
				uint64_t iova, int access)
{
	struct vf_mr *mr;
	int id;

	if (!pd) {
		errno = EINVAL;
		return NULL;
	}
	mr = calloc(1, sizeof(*mr));
	if (!mr) {
		errno = ENOMEM;
		return NULL;
	}
	id = vfgoRegMR(VF(pd, vf_pd)->id, addr, length, iova, access, &mr->ibv);
	if (id < 0) {
		free(mr);
		errno = -id;
		return NULL;
	}
	mr->id = id;
	mr->ibv.context = pd->context;
	mr->ibv.pd = pd;
	mr->ibv.addr = addr;
	mr->ibv.length = length;
	return &mr->ibv;
}

ABI_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
	return vf_reg_mr(pd, addr, length, (uint64_t)(uintptr_t)addr, access);
}

ABI_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
					  uint64_t iova, int access)
{
	return vf_reg_mr(pd, addr, length, iova, access);
}

ABI_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length,
					   uint64_t iova, unsigned int access)
{
	return vf_reg_mr(pd, addr, length, iova, (int)access);
}

ABI_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
					    uint64_t iova, int fd, int access)
{
	(void)pd; (void)offset; (void)length; (void)iova; (void)fd; (void)access;
	errno = EOPNOTSUPP;
	return NULL;
}

ABI_EXPORT int ibv_dereg_mr(struct ibv_mr *mr)
{
	int r;

	if (!mr)
		return EINVAL;
	r = vfgoDeregMR(VF(mr, vf_mr)->id);
	if (r < 0)
		return -r;
	free(mr);
	return 0;
}

ABI_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd,
			    void *addr, size_t length, int access)
{
	(void)mr; (void)flags; (void)pd; (void)addr; (void)length; (void)access;
	errno = EOPNOTSUPP;
	return IBV_REREG_MR_ERR_INPUT;
}

ABI_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
	struct vf_ah *ah;
	int id;

	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	id = vfgoCreateAH(VF(pd, vf_pd)->id, attr);
	if (id < 0) {
		errno = -id;
		return NULL;
	}
	ah = calloc(1, sizeof(*ah));
	if (!ah) {
		vfgoDestroyAH(id);
		errno = ENOMEM;
		return NULL;
	}
	ah->id = id;
	ah->ibv.context = pd->context;
	ah->ibv.pd = pd;
	ah->ibv.handle = id;
	return &ah->ibv;
}

ABI_EXPORT int ibv_destroy_ah(struct ibv_ah *ah)
{
	int r;

	if (!ah)
		return EINVAL;
	r = vfgoDestroyAH(VF(ah, vf_ah)->id);
	if (r)
		return r;
	free(ah);
	return 0;
}

/* ---- completion channels and CQs ---- */

ABI_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
	struct vf_channel *ch;
	int id, fd = -1;

	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	id = vfgoCreateChannel(to_vctx(context)->id, &fd);
	if (id < 0) {
		errno = -id;
		return NULL;
	}
	ch = calloc(1, sizeof(*ch));
	if (!ch) {
		vfgoDestroyChannel(id);
		errno = ENOMEM;
		return NULL;
	}
	ch->id = id;
	ch->ibv.context = context;
	ch->ibv.fd = fd;
	ch->ibv.refcnt = 0;
	return &ch->ibv;
}

ABI_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
	int r;

	if (!channel)
		return EINVAL;
	r = vfgoDestroyChannel(VF(channel, vf_channel)->id);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	free(channel);
	return 0;
}

ABI_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe,
					void *cq_context, struct ibv_comp_channel *channel,
					int comp_vector)
{
	struct vf_cq *cq;
	int id;

	(void)comp_vector;
	if (!context) {
		errno = EINVAL;
		return NULL;
	}
	cq = calloc(1, sizeof(*cq));
	if (!cq) {
		errno = ENOMEM;
		return NULL;
	}
	cq->ibv.context = context;
	cq->ibv.channel = channel;
	cq->ibv.cq_context = cq_context;
	pthread_mutex_init(&cq->ibv.mutex, NULL);
	pthread_cond_init(&cq->ibv.cond, NULL);
	id = vfgoCreateCQ(to_vctx(context)->id, cqe,
			  channel ? VF(channel, vf_channel)->id : 0, cq);
	if (id < 0) {
		free(cq);
		errno = -id;
		return NULL;
	}
	cq->id = id;
	if (channel)
		__atomic_add_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
	return &cq->ibv;
}

ABI_EXPORT int ibv_destroy_cq(struct ibv_cq *cq)
{
	struct ibv_comp_channel *channel;
	int r;

	if (!cq)
		return EINVAL;
	channel = cq->channel;
	r = vfgoDestroyCQ(VF(cq, vf_cq)->id);
	if (r < 0)
		return -r;
	if (channel)
		__atomic_sub_fetch(&channel->refcnt, 1, __ATOMIC_RELAXED);
	pthread_mutex_destroy(&cq->mutex);
	pthread_cond_destroy(&cq->cond);
	free(cq);
	return 0;
}

ABI_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
	(void)cq; (void)cqe;
	return EOPNOTSUPP;
}

ABI_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *channel,
				struct ibv_cq **cq, void **cq_context)
{
	void *p = NULL;
	int r;

	if (!channel || !cq) {
		errno = EINVAL;
		return -1;
	}
	r = vfgoGetCQEvent(VF(channel, vf_channel)->id, &p);
	if (r < 0)
		return vf_fail(r);
	*cq = p;
	if (cq_context)
		*cq_context = (*cq)->cq_context;
	return 0;
}

ABI_EXPORT void ibv_ack_cq_events(struct ibv_cq *cq, unsigned int nevents)
{
	if (cq)
		vfgoAckCQEvents(VF(cq, vf_cq)->id, nevents);
}

/* ---- queue pairs and shared receive queues ---- */

ABI_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct vf_qp *qp;
	int id;

	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	id = vfgoCreateQP(VF(pd, vf_pd)->id, attr, qp);
	if (id < 0) {
		free(qp);
		errno = -id;
		return NULL;
	}
	qp->id = id;
	qp->ibv.context = pd->context;
	qp->ibv.qp_context = attr->qp_context;
	qp->ibv.pd = pd;
	qp->ibv.send_cq = attr->send_cq;
	qp->ibv.recv_cq = attr->recv_cq;
	qp->ibv.srq = attr->srq;
	qp->ibv.qp_type = attr->qp_type;
	qp->ibv.state = IBV_QPS_RESET;
	qp->ibv.events_completed = 0;
	pthread_mutex_init(&qp->ibv.mutex, NULL);
	pthread_cond_init(&qp->ibv.cond, NULL);
	return &qp->ibv;
}

ABI_EXPORT struct ibv_qp_ex *ibv_qp_to_qp_ex(struct ibv_qp *qp)
{
	(void)qp;
	errno = EOPNOTSUPP;
	return NULL;
}

ABI_EXPORT int ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	int r;

	if (!qp || !attr)
		return EINVAL;
	r = vfgoModifyQP(VF(qp, vf_qp)->id, attr, attr_mask);
	if (r == 0 && (attr_mask & IBV_QP_STATE))
		qp->state = attr->qp_state;
	return r;
}

ABI_EXPORT int ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			    int attr_mask, struct ibv_qp_init_attr *init_attr)
{
	int r;

	(void)attr_mask;
	if (!qp || !attr)
		return EINVAL;
	r = vfgoQueryQP(VF(qp, vf_qp)->id, attr, init_attr);
	if (r)
		return r;
	qp->state = attr->qp_state;
	if (init_attr) {
		init_attr->qp_context = qp->qp_context;
		init_attr->send_cq = qp->send_cq;
		init_attr->recv_cq = qp->recv_cq;
		init_attr->srq = qp->srq;
		init_attr->qp_type = qp->qp_type;
	}
	return 0;
}

ABI_EXPORT int ibv_destroy_qp(struct ibv_qp *qp)
{
	int r;

	if (!qp)
		return EINVAL;
	r = vfgoDestroyQP(VF(qp, vf_qp)->id);
	if (r)
		return r;
	pthread_mutex_destroy(&qp->mutex);
	pthread_cond_destroy(&qp->cond);
	free(qp);
	return 0;
}

ABI_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
	struct vf_srq *srq;
	int id;

	if (!pd || !attr) {
		errno = EINVAL;
		return NULL;
	}
	srq = calloc(1, sizeof(*srq));
	if (!srq) {
		errno = ENOMEM;
		return NULL;
	}
	id = vfgoCreateSRQ(VF(pd, vf_pd)->id, &attr->attr, srq);
	if (id < 0) {
		free(srq);
		errno = -id;
		return NULL;
	}
	srq->id = id;
	srq->ibv.context = pd->context;
	srq->ibv.srq_context = attr->srq_context;
	srq->ibv.pd = pd;
	pthread_mutex_init(&srq->ibv.mutex, NULL);
	pthread_cond_init(&srq->ibv.cond, NULL);
	return &srq->ibv;
}

ABI_EXPORT int ibv_modify_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr, int mask)
{
	if (!srq || !attr)
		return EINVAL;
	return vfgoModifySRQ(VF(srq, vf_srq)->id, attr, mask);
}

ABI_EXPORT int ibv_query_srq(struct ibv_srq *srq, struct ibv_srq_attr *attr)
{
	if (!srq || !attr)
		return EINVAL;
	return vfgoQuerySRQ(VF(srq, vf_srq)->id, attr);
}

ABI_EXPORT int ibv_destroy_srq(struct ibv_srq *srq)
{
	int r;

	if (!srq)
		return EINVAL;
	r = vfgoDestroySRQ(VF(srq, vf_srq)->id);
	if (r)
		return r;
	pthread_mutex_destroy(&srq->mutex);
	pthread_cond_destroy(&srq->cond);
	free(srq);
	return 0;
}

/* ---- asynchronous events ---- */

ABI_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
	void *obj = NULL;
	int type = 0, port = 0, r;

	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	r = vfgoGetAsyncEvent(to_vctx(context)->id, &type, &obj, &port);
	if (r < 0)
		return vf_fail(r);
	memset(event, 0, sizeof(*event));
	event->event_type = (enum ibv_event_type)type;
	switch (type) {
	case IBV_EVENT_CQ_ERR:
		event->element.cq = obj;
		break;
	case IBV_EVENT_SRQ_ERR:
	case IBV_EVENT_SRQ_LIMIT_REACHED:
		event->element.srq = obj;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		event->element.port_num = port;
		break;
	case IBV_EVENT_DEVICE_FATAL:
		break;
	default:
		event->element.qp = obj;
	}
	return 0;
}

ABI_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event; /* destroy calls do not wait for acks */
}
