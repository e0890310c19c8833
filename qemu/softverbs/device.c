/*
 * The device: device list, contexts, node setup, device/port/GID/P_Key
 * queries and asynchronous events.
 */
#include "softverbs.h"

#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

struct sv_state sv = {
	.lock = PTHREAD_MUTEX_INITIALIZER,
	.listen_fd = -1,
	.wake_fd = -1,
};

/*
 * The device sits where rdma-core puts a struct verbs_device: the generic
 * part first, then the owning provider's ops. Provider libraries linked
 * into a program (libmlx5, libefa, ...) tell their own devices apart by
 * comparing that ops pointer, e.g. in mlx5dv_open_device or
 * efadv_query_device; here it is NULL (no provider owns softverbs0), so
 * they answer "not my device" instead of reading past the structure.
 */
static struct {
	struct ibv_device ibv;
	const void *ops;          /* verbs_device.ops: always NULL */
	void *reserved[6];        /* rest of struct verbs_device, zero */
} sv_dev;
static pthread_once_t sv_device_once = PTHREAD_ONCE_INIT;

/* fork(2): the state is copied while locked, so the child sees it whole.
 * The child does not inherit the node (its copies of contexts are not
 * usable); it may open the device afresh as a node of its own. */
static void sv_atfork_prepare(void) { sv_lock(); }
static void sv_atfork_parent(void) { sv_unlock(); }

static void sv_atfork_child(void)
{
	struct sv_list *p;

	if (sv.refs > 0) {
		sv_list_each(p, &sv.conns)
			close(sv_container_of(p, struct sv_conn, link)->fd);
		close(sv.listen_fd);
		close(sv.wake_fd);
	}
	sv.refs = 0;
	sv_stats_forget();
	sv.listen_fd = sv.wake_fd = -1;
	sv.stop = 0;
	sv_unlock(); /* taken by this thread in sv_atfork_prepare */
}

static void sv_device_init(void)
{
	const char *dbg = getenv("SOFTVERBS_DEBUG");
	const char *pp = getenv("SOFTVERBS_POLL_PROGRESS");

	pthread_atfork(sv_atfork_prepare, sv_atfork_parent, sv_atfork_child);

	sv.debug = dbg && *dbg && strcmp(dbg, "0") != 0;
	sv.no_poll_progress = pp && strcmp(pp, "0") == 0;
	sv_dev.ibv.node_type = IBV_NODE_CA;
	sv_dev.ibv.transport_type = IBV_TRANSPORT_IB;
	snprintf(sv_dev.ibv.name, sizeof(sv_dev.ibv.name), "%s", SV_DEV_NAME);
	snprintf(sv_dev.ibv.dev_name, sizeof(sv_dev.ibv.dev_name), "%s", SV_DEV_NAME);
	/* No sysfs entries exist for this device; these paths are placeholders. */
	snprintf(sv_dev.ibv.dev_path, sizeof(sv_dev.ibv.dev_path),
		 "/sys/class/infiniband_verbs/%s", SV_DEV_NAME);
	snprintf(sv_dev.ibv.ibdev_path, sizeof(sv_dev.ibv.ibdev_path),
		 "/sys/class/infiniband/%s", SV_DEV_NAME);
}

/* ---- node identity ---- */

/* The node name this process uses: $SOFTVERBS_NODE or pid<PID>. */
static int sv_env_node(char *out, size_t len)
{
	const char *n = getenv("SOFTVERBS_NODE");

	if (n && *n) {
		if (!sv_valid_node_name(n))
			return -EINVAL;
		snprintf(out, len, "%s", n);
	} else {
		snprintf(out, len, "pid%d", (int)getpid());
	}
	return 0;
}

/* Index 1 GID: fe80::/64 and a 64-bit FNV-1a hash of the node name as the
 * interface id (never zero, so that tools treat it as a real address). */
void sv_node_gid1(const char *node, union ibv_gid *gid)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (const char *p = node; *p; p++) {
		h ^= (uint8_t)*p;
		h *= 0x100000001b3ull;
	}
	if (h == 0)
		h = 1;
	memset(gid, 0, sizeof(*gid));
	gid->raw[0] = 0xfe;
	gid->raw[1] = 0x80;
	for (int i = 0; i < 8; i++)
		gid->raw[8 + i] = (uint8_t)(h >> (56 - 8 * i));
}

static void sv_gid_path(const union ibv_gid *gid, char *path, size_t len)
{
	char hex[33];

	sv_gid_hex(gid, hex);
	snprintf(path, len, "%s/gid/%s", sv.fabric, hex);
}

/* Reads a one-line text file into buf (without the newline). */
static int sv_read_line(const char *path, char *buf, size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return -1;
	n = read(fd, buf, len - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' ||
			 buf[n - 1] == ' '))
		buf[--n] = 0;
	return 0;
}

static void sv_remove_gid1_file(void)
{
	char path[1024], owner[256];

	sv_gid_path(&sv.gid1, path, sizeof(path));
	if (sv_read_line(path, owner, sizeof(owner)) == 0 &&
	    strcmp(owner, sv.node) == 0)
		unlink(path);
}

/* Sets up this process as a fabric node: directories, socket, progress
 * thread, and the registration of its default GID. Called locked. */
int sv_node_acquire(void)
{
	const char *fab = getenv("SOFTVERBS_FABRIC");
	char dir[1024], path[1024], text[256];
	int ret;

	if (sv.refs > 0) {
		sv.refs++;
		return 0;
	}
	ret = sv_env_node(sv.node, sizeof(sv.node));
	if (ret)
		return ret;
	snprintf(sv.fabric, sizeof(sv.fabric), "%s",
		 fab && *fab ? fab : "/tmp/softverbs");
	snprintf(sv.node_dir, sizeof(sv.node_dir), "%s/node/%s", sv.fabric,
		 sv.node);
	snprintf(sv.sock_path, sizeof(sv.sock_path), "%s/sock", sv.node_dir);
	if (strlen(sv.sock_path) >= 108)
		return -ENAMETOOLONG;

	sv_list_init(&sv.contexts);
	sv_list_init(&sv.conns);
	sv_list_init(&sv.qps);
	for (int i = 0; i < SV_HASH; i++) {
		sv_list_init(&sv.qp_hash[i]);
		sv_list_init(&sv.mr_hash[i]);
	}
	if (sv.next_qpn == 0)
		sv.next_qpn = 0x10;
	if (sv.next_key == 0)
		sv.next_key = 1;

	ret = sv_mkdirs(sv.node_dir);
	if (ret)
		return ret;
	snprintf(dir, sizeof(dir), "%s/gid", sv.fabric);
	ret = sv_mkdirs(dir);
	if (ret)
		return ret;

	sv_node_gid1(sv.node, &sv.gid1);
	sv_stats_open();
	ret = sv_fabric_start();
	if (ret)
		return ret;

	sv_gid_path(&sv.gid1, path, sizeof(path));
	snprintf(text, sizeof(text), "%s\n", sv.node);
	ret = sv_write_file_atomic(path, text);
	if (ret) {
		sv_fabric_stop();
		return ret;
	}
	sv.refs = 1;
	sv_dbg("node %s up on %s\n", sv.node, sv.sock_path);
	return 0;
}

/* Drops one context reference; the last one takes the node down. */
void sv_node_release(void)
{
	if (--sv.refs > 0)
		return;
	sv_remove_gid1_file();
	sv_fabric_stop();
	sv_dbg("node %s down\n", sv.node);
}

/* ---- GID table ----
 * 0: fe80:: (placeholder, never routes); 1: the node's default GID;
 * N >= 2: $FABRIC/node/<node>/gid.<N> if present, else the zero GID. */
int sv_query_gid_locked(int index, union ibv_gid *gid)
{
	char path[1024], line[128];

	if (index < 0 || index >= SV_GID_TBL_LEN)
		return -EINVAL;
	memset(gid, 0, sizeof(*gid));
	if (index == 0) {
		gid->raw[0] = 0xfe;
		gid->raw[1] = 0x80;
		return 0;
	}
	if (index == 1) {
		*gid = sv.gid1;
		return 0;
	}
	snprintf(path, sizeof(path), "%s/gid.%d", sv.node_dir, index);
	if (sv_read_line(path, line, sizeof(line)) == 0 &&
	    strlen(line) == 32 && sv_gid_parse(line, gid) == 0)
		return 0;
	memset(gid, 0, sizeof(*gid));
	return 0;
}

/* Finds the node that owns a GID: our own default GID, else the
 * registration file $FABRIC/gid/<hex>. */
int sv_resolve_gid(const union ibv_gid *gid, char *node, size_t len)
{
	char path[1024], line[256];

	if (memcmp(gid, &sv.gid1, sizeof(*gid)) == 0) {
		snprintf(node, len, "%s", sv.node);
		return 0;
	}
	sv_gid_path(gid, path, sizeof(path));
	if (sv_read_line(path, line, sizeof(line)) < 0 ||
	    !sv_valid_node_name(line))
		return -1;
	snprintf(node, len, "%s", line);
	return 0;
}

/* ---- device list ---- */

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
	struct ibv_device **list;

	pthread_once(&sv_device_once, sv_device_init);
	list = calloc(2, sizeof(*list));
	if (!list) {
		errno = ENOMEM;
		return NULL;
	}
	list[0] = &sv_dev.ibv;
	if (num_devices)
		*num_devices = 1;
	return list;
}

SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
	return device == &sv_dev.ibv ? 0 : -1;
}

static __be64 sv_node_guid(void)
{
	char node[128];
	union ibv_gid gid;
	__be64 guid;

	sv_lock();
	if (sv.refs > 0)
		gid = sv.gid1;
	else if (sv_env_node(node, sizeof(node)) == 0)
		sv_node_gid1(node, &gid);
	else
		memset(&gid, 0, sizeof(gid));
	sv_unlock();
	memcpy(&guid, &gid.raw[8], sizeof(guid));
	return guid;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
	(void)device;
	return sv_node_guid();
}

/* ---- contexts ----
 *
 * A context is the tail of an otherwise empty struct verbs_context:
 * abi_compat says "extended" and every extended op is NULL, so the inline
 * extended verbs of <infiniband/verbs.h> find no op and take their legacy
 * path or fail with EOPNOTSUPP. Provider code that gets a softverbs
 * context (e.g. efadv_query_device, which logs "not an EFA device"
 * through verbs_get_ctx() before failing) finds the structure it expects.
 */
struct sv_context_box {
	unsigned char vctx_head[offsetof(struct verbs_context, context)];
	struct sv_context ctx;
};
_Static_assert(offsetof(struct sv_context_box, ctx) ==
		       offsetof(struct verbs_context, context),
	       "the context must sit where verbs_context.context does");
_Static_assert(offsetof(struct sv_context, ibv) == 0,
	       "struct ibv_context must open struct sv_context");

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct sv_context_box *box;
	struct sv_context *ctx;
	size_t vctx_size = sizeof(struct verbs_context);
	int ret;

	pthread_once(&sv_device_once, sv_device_init);
	if (device != &sv_dev.ibv) {
		errno = ENODEV;
		return NULL;
	}
	box = calloc(1, sizeof(*box));
	if (!box) {
		errno = ENOMEM;
		return NULL;
	}
	memcpy(box->vctx_head + offsetof(struct verbs_context, sz), &vctx_size,
	       sizeof(vctx_size));
	ctx = &box->ctx;
	ctx->ibv.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
	if (ctx->ibv.async_fd < 0) {
		free(box);
		return NULL;
	}
	sv_lock();
	ret = sv_node_acquire();
	if (ret) {
		sv_unlock();
		close(ctx->ibv.async_fd);
		free(box);
		errno = -ret;
		return NULL;
	}
	ctx->ibv.device = device;
	ctx->ibv.cmd_fd = -1;
	ctx->ibv.num_comp_vectors = 1;
	ctx->ibv.abi_compat = __VERBS_ABI_IS_EXTENDED;
	pthread_mutex_init(&ctx->ibv.mutex, NULL);
	/* The data path goes through the legacy ops. */
	ctx->ibv.ops.poll_cq = sv_poll_cq;
	ctx->ibv.ops.req_notify_cq = sv_req_notify_cq;
	ctx->ibv.ops.post_send = sv_post_send;
	ctx->ibv.ops.post_recv = sv_post_recv;
	ctx->ibv.ops.post_srq_recv = sv_post_srq_recv;
	sv_list_init(&ctx->pds);
	sv_list_init(&ctx->mrs);
	sv_list_init(&ctx->cqs);
	sv_list_init(&ctx->qps);
	sv_list_init(&ctx->srqs);
	sv_list_init(&ctx->ahs);
	sv_list_init(&ctx->channels);
	sv_list_init(&ctx->async_events);
	sv_list_add_tail(&sv.contexts, &ctx->link);
	sv_unlock();
	return &ctx->ibv;
}

/* Releases everything a context still owns, dependents first. */
static void sv_context_free_objects(struct sv_context *ctx)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &ctx->qps)
		sv_qp_free(sv_container_of(p, struct sv_qp, link));
	sv_list_each_safe(p, t, &ctx->srqs)
		sv_srq_free(sv_container_of(p, struct sv_srq, link));
	sv_list_each_safe(p, t, &ctx->cqs)
		sv_cq_free(sv_container_of(p, struct sv_cq, link));
	sv_list_each_safe(p, t, &ctx->channels)
		sv_channel_free(sv_container_of(p, struct sv_channel, link));
	sv_list_each_safe(p, t, &ctx->ahs)
		sv_ah_free(sv_container_of(p, struct sv_ah, link));
	sv_list_each_safe(p, t, &ctx->mrs)
		sv_mr_free(sv_container_of(p, struct sv_mr, link));
	sv_list_each_safe(p, t, &ctx->pds)
		sv_pd_free(sv_container_of(p, struct sv_pd, link));
	sv_list_each_safe(p, t, &ctx->async_events) {
		sv_list_del(p);
		free(sv_container_of(p, struct sv_async_event, link));
	}
}

SV_EXPORT int ibv_close_device(struct ibv_context *context)
{
	struct sv_context *ctx;

	if (!context)
		return EINVAL;
	ctx = to_ctx(context);
	sv_lock();
	sv_context_free_objects(ctx);
	sv_list_del(&ctx->link);
	close(ctx->ibv.async_fd);
	pthread_mutex_destroy(&ctx->ibv.mutex);
	free(sv_container_of(ctx, struct sv_context_box, ctx));
	sv_node_release();
	sv_unlock();
	sv_kick(); /* refusals of held messages may be queued */
	return 0;
}

/* ---- queries ---- */

SV_EXPORT int ibv_query_device(struct ibv_context *context,
			       struct ibv_device_attr *a)
{
	if (!context || !a)
		return EINVAL;
	memset(a, 0, sizeof(*a));
	snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs 1.0");
	a->node_guid = sv_node_guid();
	a->sys_image_guid = a->node_guid;
	a->max_mr_size = SV_MAX_MR_SIZE;
	a->page_size_cap = 0xfffff000;
	a->vendor_id = 0;
	a->vendor_part_id = 0;
	a->hw_ver = 1;
	a->max_qp = SV_MAX_QP;
	a->max_qp_wr = SV_MAX_QP_WR;
	a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_SRQ_RESIZE |
			      IBV_DEVICE_PORT_ACTIVE_EVENT;
	a->max_sge = SV_MAX_SGE;
	a->max_sge_rd = SV_MAX_SGE;
	a->max_cq = SV_MAX_CQ;
	a->max_cqe = SV_MAX_CQE;
	a->max_mr = SV_MAX_MR;
	a->max_pd = SV_MAX_PD;
	a->max_qp_rd_atom = SV_MAX_RD_ATOM;
	a->max_qp_init_rd_atom = SV_MAX_RD_ATOM;
	a->max_res_rd_atom = SV_MAX_RD_ATOM * SV_MAX_QP;
	a->atomic_cap = IBV_ATOMIC_NONE;
	a->max_ah = SV_MAX_AH;
	a->max_srq = SV_MAX_SRQ;
	a->max_srq_wr = SV_MAX_SRQ_WR;
	a->max_srq_sge = SV_MAX_SGE;
	a->max_pkeys = 1;
	a->local_ca_ack_delay = 15;
	a->phys_port_cnt = 1;
	return 0;
}

/* The exported symbol takes the old, shorter port structure: write only
 * the fields it has (everything up to and including 'flags'). */
SV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
			     struct _compat_ibv_port_attr *out)
{
	struct ibv_port_attr a;

	if (!context || !out)
		return EINVAL;
	if (port_num != SV_PORT)
		return EINVAL;
	memset(&a, 0, sizeof(a));
	a.state = IBV_PORT_ACTIVE;
	a.max_mtu = SV_MTU;
	a.active_mtu = SV_MTU;
	a.gid_tbl_len = SV_GID_TBL_LEN;
	a.port_cap_flags = 0;
	a.max_msg_sz = SV_MAX_MSG;
	a.pkey_tbl_len = 1;
	a.lid = 0;
	a.sm_lid = 0;
	a.max_vl_num = 1;
	a.active_width = 2;   /* 4X */
	a.active_speed = 32;  /* 25 Gb/s per lane */
	a.phys_state = 5;     /* LinkUp */
	a.link_layer = IBV_LINK_LAYER_ETHERNET;
	memcpy((void *)out, &a, offsetof(struct ibv_port_attr, flags) + sizeof(a.flags));
	return 0;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num,
			    int index, union ibv_gid *gid)
{
	int ret;

	if (!context || !gid || port_num != SV_PORT) {
		errno = EINVAL;
		return -1;
	}
	sv_lock();
	ret = sv_query_gid_locked(index, gid);
	sv_unlock();
	if (ret) {
		errno = -ret;
		return -1;
	}
	return 0;
}

SV_EXPORT int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num,
				 unsigned int index, unsigned int *type)
{
	if (!context || !type || port_num != SV_PORT || index >= SV_GID_TBL_LEN) {
		errno = EINVAL;
		return -1;
	}
	*type = SV_GID_TYPE_ROCE_V1;
	return 0;
}

/* Newer entry behind the inline ibv_query_gid_ex(). The entry layout is
 * gid, gid_index, port_num, gid_type, ndev_ifindex. */
SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *context, uint32_t port_num,
				uint32_t gid_index, struct ibv_gid_entry *entry,
				uint32_t flags, size_t entry_size)
{
	union ibv_gid gid;
	int ret;

	if (!context || !entry || flags || port_num != SV_PORT ||
	    entry_size < sizeof(*entry))
		return EINVAL;
	sv_lock();
	ret = sv_query_gid_locked((int)gid_index, &gid);
	sv_unlock();
	if (ret)
		return -ret;
	if (sv_gid_is_zero(&gid))
		return ENODATA;
	memset(entry, 0, entry_size);
	entry->gid = gid;
	entry->gid_index = gid_index;
	entry->port_num = port_num;
	entry->gid_type = IBV_GID_TYPE_ROCE_V1;
	return 0;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *context,
				       struct ibv_gid_entry *entries,
				       size_t max_entries, uint32_t flags,
				       size_t entry_size)
{
	size_t n = 0;

	if (!context || (!entries && max_entries) || flags ||
	    entry_size < sizeof(*entries))
		return -EINVAL;
	sv_lock();
	for (int i = 0; i < SV_GID_TBL_LEN; i++) {
		union ibv_gid gid;
		struct ibv_gid_entry *e;

		sv_query_gid_locked(i, &gid);
		if (sv_gid_is_zero(&gid))
			continue;
		if (n == max_entries) {
			sv_unlock();
			return -EINVAL;
		}
		e = (struct ibv_gid_entry *)((char *)entries + n * entry_size);
		memset(e, 0, entry_size);
		e->gid = gid;
		e->gid_index = (uint32_t)i;
		e->port_num = SV_PORT;
		e->gid_type = IBV_GID_TYPE_ROCE_V1;
		n++;
	}
	sv_unlock();
	return (ssize_t)n;
}

/* ---- asynchronous events ----
 * Delivered: IBV_EVENT_SRQ_LIMIT_REACHED, IBV_EVENT_QP_LAST_WQE_REACHED.
 * The context's async_fd is an eventfd, readable while events wait. */

void sv_async_push(struct sv_context *ctx, const struct ibv_async_event *ev)
{
	struct sv_async_event *e = calloc(1, sizeof(*e));

	if (!e)
		return;
	e->ev = *ev;
	sv_list_add_tail(&ctx->async_events, &e->link);
	sv_event_signal(ctx->ibv.async_fd);
}

/* Drops queued events that name an object about to be freed. */
void sv_async_purge(struct sv_context *ctx, const void *obj)
{
	struct sv_list *p, *t;

	sv_list_each_safe(p, t, &ctx->async_events) {
		struct sv_async_event *e =
			sv_container_of(p, struct sv_async_event, link);

		if (e->ev.element.qp == obj) {
			sv_list_del(p);
			free(e);
			sv_event_consume(ctx->ibv.async_fd);
		}
	}
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *context,
				  struct ibv_async_event *event)
{
	struct sv_context *ctx;

	if (!context || !event) {
		errno = EINVAL;
		return -1;
	}
	ctx = to_ctx(context);
	for (;;) {
		uint64_t v;
		struct sv_async_event *e;

		if (read(context->async_fd, &v, sizeof(v)) != sizeof(v)) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		sv_lock();
		e = sv_list_first(&ctx->async_events, struct sv_async_event, link);
		if (e)
			sv_list_del(&e->link);
		sv_unlock();
		if (e) {
			*event = e->ev;
			free(e);
			return 0;
		}
	}
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
	(void)event; /* destroy calls do not wait for acks here */
}
