/*
 * Unit tests of softverbs, run against the built libibverbs.so.1.
 *
 * Each case opens its own context and closes it, so the node comes up and
 * goes down between cases. Cross-process cases fork before opening the
 * device and talk through pipes. Environment: SOFTVERBS_FABRIC (a private
 * fabric directory; created if unset) and SOFTVERBS_NODE.
 *
 * Output: one line per case ("ok name" / "FAIL name: file:line: expr"),
 * then "unit: N passed, M failed". Exit status 1 on any failure.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static int passed, failed, case_failed;
static char fabric[512];
static char node[64] = "unit";

#define CHECK(cond)                                                            \
	do {                                                                   \
		if (!(cond)) {                                                 \
			printf("FAIL %s: %s:%d: %s\n", cur_case, __FILE__,     \
			       __LINE__, #cond);                               \
			case_failed = 1;                                       \
			goto out;                                              \
		}                                                              \
	} while (0)

static const char *cur_case;
static char **only; /* case names given on the command line */

static void run(const char *name, void (*fn)(void))
{
	if (only && *only) {
		char **o;

		for (o = only; *o && strcmp(*o, name); o++)
			;
		if (!*o)
			return;
	}
	cur_case = name;
	case_failed = 0;
	fn();
	if (case_failed) {
		failed++;
	} else {
		passed++;
		printf("ok %s\n", name);
	}
	fflush(stdout);
}

/* ---- helpers ---- */

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct ibv_context *open_dev(void)
{
	struct ibv_device **l = ibv_get_device_list(NULL);
	struct ibv_context *c;

	if (!l || !l[0])
		return NULL;
	c = ibv_open_device(l[0]);
	ibv_free_device_list(l);
	return c;
}

/* Polls until n completions arrived or ms passed; returns the count. */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n, int ms)
{
	uint64_t end = now_ms() + (uint64_t)ms;
	int got = 0;

	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);

		if (r < 0)
			return -1;
		got += r;
		if (got < n) {
			if (now_ms() > end)
				break;
			usleep(200);
		}
	}
	return got;
}

static struct ibv_qp *make_qp(struct ibv_pd *pd, struct ibv_cq *cq,
			      enum ibv_qp_type t, struct ibv_srq *srq, int depth)
{
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.srq = srq,
		.cap = { .max_send_wr = depth, .max_recv_wr = depth,
			 .max_send_sge = 4, .max_recv_sge = 4 },
		.qp_type = t,
	};
	return ibv_create_qp(pd, &a);
}

static int qp_init(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qkey = 0x11111111,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;

	mask |= qp->qp_type == IBV_QPT_UD ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS;
	return ibv_modify_qp(qp, &a, mask);
}

struct conn_opts {
	int rnr_retry, retry_cnt, timeout, sgid_index;
};

static const struct conn_opts dflt = { 7, 7, 14, 1 };

/* INIT -> RTR -> RTS. Connected QPs aim at (dgid, dqpn). */
static int qp_connect(struct ibv_qp *qp, const union ibv_gid *dgid, uint32_t dqpn,
		      const struct conn_opts *o)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	int ret;

	if (qp->qp_type == IBV_QPT_UD) {
		ret = ibv_modify_qp(qp, &a, IBV_QP_STATE);
		if (ret)
			return ret;
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN);
	}
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dqpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = (uint8_t)o->sgid_index;
	a.ah_attr.grh.hop_limit = 1;
	ret = ibv_modify_qp(qp, &a,
			    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				    IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				    (qp->qp_type == IBV_QPT_RC ?
					     IBV_QP_MAX_DEST_RD_ATOMIC |
						     IBV_QP_MIN_RNR_TIMER : 0));
	if (ret)
		return ret;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = (uint8_t)o->timeout;
	a.retry_cnt = (uint8_t)o->retry_cnt;
	a.rnr_retry = (uint8_t)o->rnr_retry;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_SQ_PSN |
				     (qp->qp_type == IBV_QPT_RC ?
					      IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
						      IBV_QP_RNR_RETRY |
						      IBV_QP_MAX_QP_RD_ATOMIC : 0));
}

static int post_send(struct ibv_qp *qp, uint64_t id, void *addr, uint32_t len,
		     uint32_t lkey, int flags, struct ibv_ah *ah, uint32_t rqpn)
{
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = id, .sg_list = &s, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = flags }, *bad;

	if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = rqpn;
		wr.wr.ud.remote_qkey = 0x11111111;
	}
	return ibv_post_send(qp, &wr, &bad);
}

static int post_recv(struct ibv_qp *qp, uint64_t id, void *addr, uint32_t len,
		     uint32_t lkey)
{
	struct ibv_sge s = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_recv_wr wr = { .wr_id = id, .sg_list = &s, .num_sge = 1 }, *bad;

	return ibv_post_recv(qp, &wr, &bad);
}

/* Two QPs of one type in one context, each with its own CQ, connected to
 * each other (UD: an AH aimed at our own GID). */
struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq[2];
	struct ibv_qp *qp[2];
	struct ibv_ah *ah;
	struct ibv_mr *mr;
	uint8_t *buf;
	size_t len;
	union ibv_gid gid;
};

static int pair_open(struct pair *p, enum ibv_qp_type t, size_t len,
		     const struct conn_opts *o)
{
	memset(p, 0, sizeof(*p));
	p->ctx = open_dev();
	if (!p->ctx)
		return -1;
	p->pd = ibv_alloc_pd(p->ctx);
	p->len = len;
	p->buf = calloc(1, len);
	p->mr = ibv_reg_mr(p->pd, p->buf, len, IBV_ACCESS_LOCAL_WRITE);
	if (!p->pd || !p->buf || !p->mr)
		return -1;
	if (ibv_query_gid(p->ctx, 1, o->sgid_index, &p->gid))
		return -1;
	for (int i = 0; i < 2; i++) {
		p->cq[i] = ibv_create_cq(p->ctx, 256, NULL, NULL, 0);
		if (!p->cq[i])
			return -1;
		p->qp[i] = make_qp(p->pd, p->cq[i], t, NULL, 128);
		if (!p->qp[i] || qp_init(p->qp[i]))
			return -1;
	}
	for (int i = 0; i < 2; i++)
		if (qp_connect(p->qp[i], &p->gid, p->qp[1 - i]->qp_num, o))
			return -1;
	if (t == IBV_QPT_UD) {
		struct ibv_ah_attr a = { .is_global = 1, .port_num = 1,
					 .grh = { .dgid = p->gid,
						  .sgid_index = (uint8_t)o->sgid_index,
						  .hop_limit = 1 } };
		p->ah = ibv_create_ah(p->pd, &a);
		if (!p->ah)
			return -1;
	}
	return 0;
}

static void pair_close(struct pair *p)
{
	if (!p->ctx)
		return;
	for (int i = 0; i < 2; i++)
		if (p->qp[i])
			ibv_destroy_qp(p->qp[i]);
	if (p->ah)
		ibv_destroy_ah(p->ah);
	for (int i = 0; i < 2; i++)
		if (p->cq[i])
			ibv_destroy_cq(p->cq[i]);
	if (p->mr)
		ibv_dereg_mr(p->mr);
	if (p->pd)
		ibv_dealloc_pd(p->pd);
	ibv_close_device(p->ctx);
	free(p->buf);
	memset(p, 0, sizeof(*p));
}

static int file_exists(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0;
}

/* mkdir -p $FABRIC/node/<node> and $FABRIC/gid, as a fabric user would */
static void make_fabric_dirs(void)
{
	char path[1024];

	mkdir(fabric, 0755);
	snprintf(path, sizeof(path), "%s/node", fabric);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/node/%s", fabric, node);
	mkdir(path, 0755);
	snprintf(path, sizeof(path), "%s/gid", fabric);
	mkdir(path, 0755);
}

static void gid_hex(const union ibv_gid *g, char *out)
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", g->raw[i]);
}

static void write_text(const char *path, const char *text)
{
	char tmp[1024];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (f) {
		fputs(text, f);
		fclose(f);
		rename(tmp, path);
	}
}

/* ---- device and queries ---- */

static void t_device_list(void)
{
	int n = -1;
	struct ibv_device **l = ibv_get_device_list(&n);

	CHECK(l && n == 1 && l[0] && !l[1]);
	CHECK(strcmp(ibv_get_device_name(l[0]), "softverbs0") == 0);
	CHECK(strcmp(l[0]->dev_name, "softverbs0") == 0);
	CHECK(ibv_get_device_guid(l[0]) != 0);
	CHECK(l[0]->transport_type == IBV_TRANSPORT_IB);
out:
	ibv_free_device_list(l);
}

static void t_query_device(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_device_attr a;

	CHECK(c);
	CHECK(ibv_query_device(c, &a) == 0);
	CHECK(a.max_mr_size >= 128ull << 20);
	CHECK(a.max_qp >= 1024 && a.max_qp_wr >= 16384 && a.max_sge == 4);
	CHECK(a.max_cq >= 2048 && a.max_cqe >= 65536 && a.max_mr >= 1024);
	CHECK(a.max_pd >= 1024 && a.max_qp_rd_atom >= 16 && a.max_ah >= 64);
	CHECK(a.max_srq >= 512 && a.max_srq_wr >= 16384 && a.max_srq_sge == 4);
	CHECK(a.max_qp_init_rd_atom >= 16 && a.phys_port_cnt == 1);
	CHECK(c->async_fd >= 0 && c->num_comp_vectors == 1);
out:
	if (c)
		ibv_close_device(c);
}

static void t_query_port(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_port_attr a;
	__be16 pkey = 0;

	CHECK(c);
	CHECK(ibv_query_port(c, 1, &a) == 0);
	CHECK(a.state == IBV_PORT_ACTIVE);
	CHECK(a.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(a.gid_tbl_len >= 16 && a.pkey_tbl_len == 1);
	CHECK(a.active_mtu == IBV_MTU_4096 && a.max_msg_sz >= (1u << 20));
	CHECK(ibv_query_port(c, 2, &a) != 0);
	CHECK(ibv_query_pkey(c, 1, 0, &pkey) == 0 && be16toh(pkey) == 0xffff);
	CHECK(ibv_query_pkey(c, 1, 1, &pkey) != 0);
out:
	if (c)
		ibv_close_device(c);
}

static void t_query_gid(void)
{
	struct ibv_context *c = open_dev();
	union ibv_gid g0, g1, g;
	char hex[33], path[1024], line[256] = "";
	FILE *f;

	CHECK(c);
	CHECK(ibv_query_gid(c, 1, 0, &g0) == 0);
	CHECK(g0.raw[0] == 0xfe && g0.raw[1] == 0x80 && g0.global.interface_id == 0);
	CHECK(ibv_query_gid(c, 1, 1, &g1) == 0);
	CHECK(g1.raw[0] == 0xfe && g1.raw[1] == 0x80 && g1.global.interface_id != 0);
	/* index 1 is registered in the fabric under our node name */
	gid_hex(&g1, hex);
	snprintf(path, sizeof(path), "%s/gid/%s", fabric, hex);
	f = fopen(path, "r");
	CHECK(f);
	CHECK(fgets(line, sizeof(line), f));
	fclose(f);
	CHECK(strcmp(line, "unit\n") == 0);
	CHECK(ibv_query_gid(c, 1, 2, &g) == 0 && g.global.interface_id == 0 &&
	      g.global.subnet_prefix == 0);
	CHECK(ibv_query_gid(c, 1, 100000, &g) == -1);
	CHECK(ibv_query_gid(c, 1, -1, &g) == -1);
	CHECK(ibv_query_gid(c, 2, 0, &g) == -1);
	/* gid.N files written at run time show up at once, and go away */
	snprintf(path, sizeof(path), "%s/node/%s/gid.3", fabric, node);
	write_text(path, "20010db8000000000000000000000042\n");
	CHECK(ibv_query_gid(c, 1, 3, &g) == 0);
	CHECK(g.raw[0] == 0x20 && g.raw[1] == 0x01 && g.raw[15] == 0x42);
	{
		struct ibv_gid_entry e;

		CHECK(ibv_query_gid_ex(c, 1, 3, &e, 0) == 0 && e.gid_index == 3 &&
		      e.gid.raw[15] == 0x42);
		CHECK(ibv_query_gid_ex(c, 1, 4, &e, 0) == ENODATA);
	}
	unlink(path);
	CHECK(ibv_query_gid(c, 1, 3, &g) == 0 && g.raw[0] == 0);
	/* garbage is read as an empty entry */
	write_text(path, "not a gid\n");
	CHECK(ibv_query_gid(c, 1, 3, &g) == 0 && g.raw[0] == 0);
	unlink(path);
	ibv_close_device(c);
	c = NULL;
	/* closing the last context removes the registration and the socket */
	snprintf(path, sizeof(path), "%s/gid/%s", fabric, hex);
	CHECK(!file_exists(path));
	snprintf(path, sizeof(path), "%s/node/%s/sock", fabric, node);
	CHECK(!file_exists(path));
out:
	if (c)
		ibv_close_device(c);
}

/* ---- memory regions ---- */

static void t_mr(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_pd *pd = NULL;
	struct ibv_mr *mr = NULL, *mr2 = NULL;
	char *buf = malloc(8192);
	void *hole;
	int acc = IBV_ACCESS_LOCAL_WRITE;

	CHECK(c && buf);
	pd = ibv_alloc_pd(c);
	CHECK(pd);
	mr = ibv_reg_mr(pd, buf, 8192, acc);
	CHECK(mr && mr->lkey && mr->lkey == mr->rkey && mr->addr == buf &&
	      mr->length == 8192 && mr->pd == pd);
	mr2 = ibv_reg_mr_iova2(pd, buf, 4096, 0x100000, acc);
	CHECK(mr2 && mr2->lkey != mr->lkey);
	CHECK(ibv_dealloc_pd(pd) == EBUSY);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, NULL, 4096, acc) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 0, acc) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_ON_DEMAND | acc) &&
	      errno == EOPNOTSUPP);
	/* unmapped memory cannot be registered */
	hole = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(hole != MAP_FAILED);
	munmap(hole, 8192);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, hole, 8192, acc) && errno == EFAULT);
	CHECK(ibv_dereg_mr(mr2) == 0);
	mr2 = NULL;
	CHECK(ibv_dereg_mr(mr) == 0);
	mr = NULL;
	CHECK(ibv_dealloc_pd(pd) == 0);
	pd = NULL;
out:
	if (mr2)
		ibv_dereg_mr(mr2);
	if (mr)
		ibv_dereg_mr(mr);
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
	free(buf);
}

/* SGE checks: IOVA translation, bounds, keys, PD, LOCAL_WRITE. */
static void t_mr_bounds(void)
{
	struct pair p;
	struct ibv_wc wc[4];
	struct ibv_mr *iomr = NULL;
	uint8_t *b;

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	b = p.buf;
	/* an MR at IOVA 0x40000000: SGE addresses are IOVAs */
	iomr = ibv_reg_mr_iova2(p.pd, b + 4096, 4096, 0x40000000, IBV_ACCESS_LOCAL_WRITE);
	CHECK(iomr);
	memset(b, 0, 8192);
	memcpy(b, "hello iova", 10);
	CHECK(post_recv(p.qp[1], 1, (void *)(uintptr_t)0x40000100, 64, iomr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, b, 10, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(memcmp(b + 4096 + 0x100, "hello iova", 10) == 0);
	/* one byte past the end of the MR */
	CHECK(post_send(p.qp[0], 3, b + 8192 - 10, 11, p.mr->lkey, IBV_SEND_SIGNALED,
			NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_LOC_PROT_ERR &&
	      wc[0].wr_id == 3);
out:
	if (iomr)
		ibv_dereg_mr(iomr);
	pair_close(&p);
}

/* ---- QP state machine ---- */

static void t_qp_states(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp = NULL, *ud = NULL;
	struct ibv_qp_attr a, q;
	struct ibv_qp_init_attr ia;
	union ibv_gid gid;
	char buf[64];

	CHECK(c);
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	CHECK(pd && cq);
	CHECK(ibv_query_gid(c, 1, 1, &gid) == 0);
	qp = make_qp(pd, cq, IBV_QPT_RC, NULL, 8);
	CHECK(qp && qp->state == IBV_QPS_RESET && qp->qp_num >= 0x10 && qp->qp_num < 0x10000);
	CHECK(ibv_destroy_cq(cq) == EBUSY);
	/* posting: receive not in RESET, send not before RTS */
	CHECK(post_recv(qp, 1, buf, 8, 0) == EINVAL);
	CHECK(post_send(qp, 1, buf, 8, 0, 0, NULL, 0) == EINVAL);
	/* RESET -> RTR is illegal; INIT needs its attributes */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL);
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS | IBV_QP_QKEY) == EINVAL);
	a.port_num = 2;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS) == EINVAL);
	CHECK(qp_init(qp) == 0 && qp->state == IBV_QPS_INIT);
	CHECK(post_send(qp, 1, buf, 8, 0, 0, NULL, 0) == EINVAL);
	/* INIT -> RTR: missing attributes, LID-only address, empty GID index */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV) == EINVAL);
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = 0x42;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = 1;
	{
		int m = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;

		CHECK(ibv_modify_qp(qp, &a, m) == EINVAL); /* not global */
		a.ah_attr.is_global = 1;
		a.ah_attr.grh.dgid = gid;
		a.ah_attr.grh.sgid_index = 9; /* empty entry */
		CHECK(ibv_modify_qp(qp, &a, m) == EINVAL);
		a.ah_attr.grh.sgid_index = 1;
		a.path_mtu = 7;
		CHECK(ibv_modify_qp(qp, &a, m) == EINVAL);
		a.path_mtu = IBV_MTU_1024;
		CHECK(ibv_modify_qp(qp, &a, m) == 0 && qp->state == IBV_QPS_RTR);
	}
	/* RTR -> RTS needs the RC send attributes */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN) == EINVAL);
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0x123456;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					    IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					    IBV_QP_MAX_QP_RD_ATOMIC) == 0);
	CHECK(ibv_query_qp(qp, &q, IBV_QP_STATE, &ia) == 0);
	CHECK(q.qp_state == IBV_QPS_RTS && q.dest_qp_num == 0x42 && q.sq_psn == 0x123456 &&
	      q.path_mtu == IBV_MTU_1024 && q.ah_attr.grh.sgid_index == 1 &&
	      q.rnr_retry == 7 && q.timeout == 14 && q.port_num == 1);
	CHECK(ia.qp_type == IBV_QPT_RC && ia.send_cq == cq && ia.cap.max_send_wr == 8 &&
	      ia.cap.max_send_sge == 4);
	/* RTS -> INIT is illegal; RTS -> RTS with an allowed attribute works */
	a.qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
	a.min_rnr_timer = 3;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_MIN_RNR_TIMER) == 0);
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_DEST_QPN) == EINVAL);
	a.cur_qp_state = IBV_QPS_INIT;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_CUR_STATE | IBV_QP_MIN_RNR_TIMER) == EINVAL);
	/* -> SQD -> RTS, -> ERR, -> RESET, and again INIT */
	a.qp_state = IBV_QPS_SQD;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_SQD);
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0);
	a.qp_state = IBV_QPS_ERR;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_ERR);
	a.qp_state = IBV_QPS_RTS;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
	a.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0 && qp->state == IBV_QPS_RESET);
	CHECK(qp_init(qp) == 0);

	/* UD: INIT needs the Q_Key; RTR takes no path; no DEST_QPN */
	ud = make_qp(pd, cq, IBV_QPT_UD, NULL, 8);
	CHECK(ud);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	CHECK(ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					    IBV_QP_ACCESS_FLAGS) == EINVAL);
	CHECK(qp_init(ud) == 0);
	a.qp_state = IBV_QPS_RTR;
	a.dest_qp_num = 5;
	CHECK(ibv_modify_qp(ud, &a, IBV_QP_STATE | IBV_QP_DEST_QPN) == EINVAL);
	CHECK(qp_connect(ud, NULL, 0, &dflt) == 0 && ud->state == IBV_QPS_RTS);
	CHECK(ibv_query_qp(ud, &q, IBV_QP_QKEY, &ia) == 0 && q.qkey == 0x11111111);
	CHECK(ibv_destroy_qp(ud) == 0);
	ud = NULL;
	CHECK(ibv_destroy_qp(qp) == 0);
	qp = NULL;
	CHECK(ibv_destroy_cq(cq) == 0);
	cq = NULL;
	/* unsupported types and capacities */
	cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	CHECK(cq);
	errno = 0;
	CHECK(!make_qp(pd, cq, IBV_QPT_RAW_PACKET, NULL, 8) && errno == EOPNOTSUPP);
	{
		struct ibv_qp_init_attr big = { .send_cq = cq, .recv_cq = cq,
						.cap = { .max_send_wr = 1, .max_send_sge = 5 },
						.qp_type = IBV_QPT_RC };
		errno = 0;
		CHECK(!ibv_create_qp(pd, &big) && errno == EINVAL);
		big.cap.max_send_sge = 1;
		big.cap.max_send_wr = 1u << 20;
		CHECK(!ibv_create_qp(pd, &big));
	}
	CHECK(!ibv_create_cq(c, 0, NULL, NULL, 0) && !ibv_create_cq(c, 1 << 24, NULL, NULL, 0));
	CHECK(!ibv_create_cq(c, 4, NULL, NULL, 1));
out:
	if (ud)
		ibv_destroy_qp(ud);
	if (qp)
		ibv_destroy_qp(qp);
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
}

/* ---- data path in one process ---- */

static void t_rc_loopback(void)
{
	const size_t big = 1 << 20;
	struct pair p;
	struct ibv_wc wc[8];
	uint8_t *s, *r;

	CHECK(pair_open(&p, IBV_QPT_RC, 4 * big, &dflt) == 0);
	s = p.buf;
	r = p.buf + 2 * big;
	for (size_t i = 0; i < big; i++)
		s[i] = (uint8_t)(i * 7 + 3);
	/* 1 MiB, scattered over two receive SGEs */
	{
		struct ibv_sge rs[2] = { { (uintptr_t)r, 4096, p.mr->lkey },
					 { (uintptr_t)r + 4096, big, p.mr->lkey } };
		struct ibv_recv_wr rw = { .wr_id = 11, .sg_list = rs, .num_sge = 2 }, *bad;

		CHECK(ibv_post_recv(p.qp[1], &rw, &bad) == 0);
	}
	CHECK(post_send(p.qp[0], 10, s, big, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 5000) == 1);
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 10 &&
	      wc[0].opcode == IBV_WC_SEND && wc[0].qp_num == p.qp[0]->qp_num);
	CHECK(poll_n(p.cq[1], wc, 1, 5000) == 1);
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == 11 &&
	      wc[0].opcode == IBV_WC_RECV && wc[0].byte_len == big &&
	      wc[0].qp_num == p.qp[1]->qp_num && wc[0].src_qp == p.qp[0]->qp_num &&
	      !(wc[0].wc_flags & IBV_WC_GRH));
	CHECK(memcmp(s, r, big) == 0);

	/* gather from 3 SGEs, send with immediate data, and a 0-byte send */
	{
		struct ibv_sge ss[3] = { { (uintptr_t)s, 3, p.mr->lkey },
					 { (uintptr_t)s + 100, 5, p.mr->lkey },
					 { (uintptr_t)s + 200, 0, 0xdead } };
		struct ibv_send_wr sw = { .wr_id = 20, .sg_list = ss, .num_sge = 3,
					  .opcode = IBV_WR_SEND_WITH_IMM,
					  .send_flags = IBV_SEND_SIGNALED,
					  .imm_data = htobe32(0xabcd0123) }, *bad;

		memset(r, 0, 64);
		CHECK(post_recv(p.qp[1], 21, r, 64, p.mr->lkey) == 0);
		CHECK(post_recv(p.qp[1], 22, r + 64, 64, p.mr->lkey) == 0);
		CHECK(ibv_post_send(p.qp[0], &sw, &bad) == 0);
		sw.num_sge = 0;
		sw.wr_id = 23;
		sw.opcode = IBV_WR_SEND;
		CHECK(ibv_post_send(p.qp[0], &sw, &bad) == 0);
	}
	CHECK(poll_n(p.cq[1], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 21 && wc[0].byte_len == 8 && (wc[0].wc_flags & IBV_WC_WITH_IMM) &&
	      be32toh(wc[0].imm_data) == 0xabcd0123);
	CHECK(memcmp(r, s, 3) == 0 && memcmp(r + 3, s + 100, 5) == 0);
	CHECK(wc[1].wr_id == 22 && wc[1].status == IBV_WC_SUCCESS && wc[1].byte_len == 0 &&
	      !(wc[1].wc_flags & IBV_WC_WITH_IMM));
	CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2 && wc[0].wr_id == 20 && wc[1].wr_id == 23);

	/* unsignaled sends complete silently; inline data needs max_inline */
	CHECK(post_recv(p.qp[1], 31, r, 64, p.mr->lkey) == 0);
	CHECK(post_recv(p.qp[1], 32, r, 64, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 30, s, 16, p.mr->lkey, 0, NULL, 0) == 0);
	CHECK(post_send(p.qp[0], 33, s, 16, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 2, 1000) == 1 && wc[0].wr_id == 33);
	CHECK(poll_n(p.cq[1], wc, 2, 1000) == 2);
	CHECK(post_send(p.qp[0], 34, s, 16, 0, IBV_SEND_INLINE, NULL, 0) == EINVAL);
	/* operations other than SEND are refused inline */
	{
		struct ibv_sge ss = { (uintptr_t)s, 8, p.mr->lkey };
		struct ibv_send_wr sw = { .wr_id = 40, .sg_list = &ss, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE }, *bad = NULL;

		CHECK(ibv_post_send(p.qp[0], &sw, &bad) == EINVAL && bad == &sw);
		sw.opcode = IBV_WR_SEND;
		sw.num_sge = 5;
		CHECK(ibv_post_send(p.qp[0], &sw, &bad) == EINVAL);
	}
out:
	pair_close(&p);
}

static void t_rc_inline(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp[2] = { 0 };
	struct ibv_mr *mr = NULL;
	union ibv_gid gid;
	char rbuf[64] = "", msg[] = "inline!";
	struct ibv_wc wc[2];

	CHECK(c);
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 16, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, rbuf, sizeof(rbuf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cq && mr && ibv_query_gid(c, 1, 1, &gid) == 0);
	for (int i = 0; i < 2; i++) {
		struct ibv_qp_init_attr a = { .send_cq = cq, .recv_cq = cq,
					      .cap = { 4, 4, 1, 1, 64 },
					      .qp_type = IBV_QPT_RC };
		qp[i] = ibv_create_qp(pd, &a);
		CHECK(qp[i] && a.cap.max_inline_data == 64 && qp_init(qp[i]) == 0);
	}
	for (int i = 0; i < 2; i++)
		CHECK(qp_connect(qp[i], &gid, qp[1 - i]->qp_num, &dflt) == 0);
	CHECK(post_recv(qp[1], 1, rbuf, sizeof(rbuf), mr->lkey) == 0);
	CHECK(post_send(qp[0], 2, msg, sizeof(msg), 0, IBV_SEND_INLINE | IBV_SEND_SIGNALED,
			NULL, 0) == 0);
	memset(msg, 0, sizeof(msg)); /* inline: the buffer is free at once */
	CHECK(poll_n(cq, wc, 2, 3000) == 2);
	CHECK(strcmp(rbuf, "inline!") == 0);
out:
	for (int i = 0; i < 2; i++)
		if (qp[i])
			ibv_destroy_qp(qp[i]);
	if (mr)
		ibv_dereg_mr(mr);
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
}

/* rnr_retry 7: the message waits at the receiver until a receive comes. */
static void t_rc_rnr_hold(void)
{
	struct pair p;
	struct ibv_wc wc[4];

	CHECK(pair_open(&p, IBV_QPT_RC, 4096, &dflt) == 0);
	memcpy(p.buf, "early", 5);
	CHECK(post_send(p.qp[0], 1, p.buf, 5, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 5, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 300) == 0);
	CHECK(post_recv(p.qp[1], 3, p.buf + 100, 100, p.mr->lkey) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 3 && wc[0].byte_len == 5);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 1 &&
	      wc[0].status == IBV_WC_SUCCESS);
	CHECK(poll_n(p.cq[0], wc, 1, 200) == 0); /* the second still waits */
	CHECK(post_recv(p.qp[1], 4, p.buf + 200, 100, p.mr->lkey) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 2);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 4);
	CHECK(memcmp(p.buf + 200, "early", 5) == 0);
out:
	pair_close(&p);
}

/* rnr_retry < 7: bounded retries end in RNR_RETRY_EXC_ERR. */
static void t_rc_rnr_exceeded(void)
{
	struct conn_opts o = { 2, 7, 14, 1 };
	struct pair p;
	struct ibv_wc wc[4];

	CHECK(pair_open(&p, IBV_QPT_RC, 4096, &o) == 0);
	CHECK(post_send(p.qp[0], 1, p.buf, 5, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 5, p.mr->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_RNR_RETRY_EXC_ERR);
	CHECK(wc[1].wr_id == 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
	CHECK(p.qp[0]->state == IBV_QPS_ERR);
out:
	pair_close(&p);
}

/* An RNR NAK that an empty poll reads (poll progress, as QEMU's completion
 * thread polls) still gets its message sent again after the RNR timer: the
 * progress thread, asleep with no timeout when the reply came, is woken to
 * keep the retry time. (Before, the message never went again: a stall.)
 * The poller reads the reply only when it wins the race with the progress
 * thread, so the case repeats. */
static void t_rc_rnr_retry_after_poll(void)
{
	struct conn_opts o = { 6, 7, 14, 1 };
	struct ibv_qp_attr a = { .min_rnr_timer = 16 }; /* 2.56 ms */
	struct pair p = { 0 };
	struct ibv_wc wc[2];

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &o) == 0);
	CHECK(ibv_modify_qp(p.qp[1], &a, IBV_QP_MIN_RNR_TIMER) == 0);
	for (int i = 0; i < 40; i++) {
		uint64_t until = now_ms() + 1;

		p.buf[0] = (uint8_t)i;
		CHECK(post_send(p.qp[0], (uint64_t)i, p.buf, 1, p.mr->lkey,
				IBV_SEND_SIGNALED, NULL, 0) == 0);
		while (now_ms() < until) /* the RNR NAK comes back meanwhile */
			CHECK(ibv_poll_cq(p.cq[0], 1, wc) == 0);
		CHECK(post_recv(p.qp[1], (uint64_t)i, p.buf + 4096, 64, p.mr->lkey) == 0);
		CHECK(poll_n(p.cq[1], wc, 1, 2000) == 1);
		CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].wr_id == (uint64_t)i &&
		      p.buf[4096] == (uint8_t)i);
		CHECK(poll_n(p.cq[0], wc, 1, 2000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	}
out:
	pair_close(&p);
}

struct trickle {
	struct pair *p;
	int n, sz, rx, failed;
};

/* Posts n receives, one every 300 us, from a thread of its own: they appear
 * while the sender's window is on the wire, whatever the posting thread of
 * the sends is doing. */
static void *trickle_recvs(void *arg)
{
	struct trickle *t = arg;

	for (int i = 0; i < t->n; i++) {
		usleep(300);
		if (post_recv(t->p->qp[1], (uint64_t)i, t->p->buf + t->rx + i * t->sz,
			      (uint32_t)t->sz, t->p->mr->lkey) != 0) {
			t->failed = 1;
			break;
		}
	}
	return NULL;
}

/* A window of sends meets a receiver that keeps running out of receives
 * (rnr_retry < 7, so it answers RNR): the refused message and every one
 * sent behind it go again, and each arrives once, in order, with its
 * contents, though receives appear while the window's frames arrive.
 * (Without the receiver's message-order check, some rounds place a later
 * message first.) The RNR timer is the longest one that is not the
 * 655 ms of code 0, 491.52 ms: six retries give the receiving thread about
 * 3 s to post its next receive. A loaded host's scheduling did not always
 * leave it 1.28 ms (RNR retries exceeded, 11 of 60 runs beside a VM test
 * loop), nor 60 ms at 10.24 ms (a fresh clone's make test at load 20). */
static void t_rc_window_rnr(void)
{
	enum { ROUNDS = 3, N = 48, SZ = 16000, RX = 4 << 20 };
	struct conn_opts o = { 6, 7, 14, 1 };
	struct ibv_qp_attr a = { .min_rnr_timer = 31 }; /* 491.52 ms */
	struct pair p = { 0 };
	struct ibv_wc wc[N];

	for (int round = 0; round < ROUNDS; round++) {
		struct trickle t = { .p = &p, .n = N, .sz = SZ, .rx = RX };
		int got = 0, sent = 0;
		uint64_t end = now_ms() + 60000; /* a hang guard */
		pthread_t th;

		CHECK(pair_open(&p, IBV_QPT_RC, 8 << 20, &o) == 0);
		CHECK(ibv_modify_qp(p.qp[1], &a, IBV_QP_MIN_RNR_TIMER) == 0);
		for (int i = 0; i < N; i++)
			p.buf[i * SZ] = (uint8_t)i;
		CHECK(pthread_create(&th, NULL, trickle_recvs, &t) == 0);
		for (int i = 0; i < N; i++) {
			if (post_send(p.qp[0], (uint64_t)i, p.buf + i * SZ, SZ, p.mr->lkey,
				      IBV_SEND_SIGNALED, NULL, 0) != 0)
				break;
			sent++;
		}
		struct ibv_wc odd = { 0 };
		int nodd = 0;
		uint64_t t0 = now_ms();

		while (got < sent && now_ms() < end) {
			int n = ibv_poll_cq(p.cq[1], N, wc);

			for (int i = 0; i < n && wc[i].wr_id == (uint64_t)got &&
					wc[i].status == IBV_WC_SUCCESS &&
					wc[i].byte_len == SZ &&
					p.buf[RX + got * SZ] == (uint8_t)got; i++)
				got++;
			if (n > 0 && got < sent && wc[n - 1].wr_id != (uint64_t)(got - 1)) {
				odd = wc[n - 1];
				nodd = n;
				break; /* out of order, a copy, or an error: checked below */
			}
			usleep(100);
		}
		if (got != N)
			printf("round %d: after %llu ms, %s", round, (unsigned long long)(now_ms() - t0),
			       nodd ? "" : "no receive completion since; ");
		if (nodd)
			printf("%d completions, the last wr_id %llu %s len %u byte %u; ", nodd,
			       (unsigned long long)odd.wr_id, ibv_wc_status_str(odd.status),
			       odd.byte_len, p.buf[RX + odd.wr_id * SZ]);
		pthread_join(th, NULL);
		CHECK(sent == N && !t.failed);
		if (got != N) {
			int m = ibv_poll_cq(p.cq[0], N, wc);

			printf("round %d: %d of %d placed; sender CQ: %d completions", round, got, N, m);
			for (int i = 0; i < m; i++)
				printf(" [%llu %s]", (unsigned long long)wc[i].wr_id, ibv_wc_status_str(wc[i].status));
			printf("; QP states %d %d\n", p.qp[0]->state, p.qp[1]->state);
		}
		CHECK(got == N);
		for (sent = 0; sent < N;) {
			int n = poll_n(p.cq[0], wc, N - sent, 3000);

			CHECK(n > 0);
			for (int i = 0; i < n; i++, sent++)
				CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == (uint64_t)sent);
		}
		pair_close(&p);
	}
out:
	pair_close(&p);
}

static void t_uc_loopback(void)
{
	struct pair p;
	struct ibv_wc wc[2];

	CHECK(pair_open(&p, IBV_QPT_UC, 8192, &dflt) == 0);
	/* no receive: the message is dropped, the send still completes */
	CHECK(post_send(p.qp[0], 1, p.buf, 100, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	usleep(20000);
	memcpy(p.buf, "uc data", 7);
	CHECK(post_recv(p.qp[1], 2, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 3, p.buf, 7, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 2);
	if (wc[0].byte_len == 100) {
		/* On a loaded machine the first message can still be on its way
		 * 20 ms later: it takes the receive. The second needs another. */
		CHECK(post_recv(p.qp[1], 4, p.buf + 4096, 4096, p.mr->lkey) == 0);
		CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 3);
		CHECK(post_send(p.qp[0], 5, p.buf, 7, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
		CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 4);
	}
	CHECK(wc[0].byte_len == 7);
	CHECK(memcmp(p.buf + 4096, "uc data", 7) == 0);
out:
	pair_close(&p);
}

static void t_ud_loopback(void)
{
	struct pair p;
	struct ibv_wc wc[4];
	uint8_t *r;

	CHECK(pair_open(&p, IBV_QPT_UD, 3 * 8192, &dflt) == 0);
	r = p.buf + 8192;
	memcpy(p.buf, "datagram", 8);
	CHECK(post_recv(p.qp[1], 1, r, 4096 + 40, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1);
	CHECK(wc[0].status == IBV_WC_SUCCESS && wc[0].byte_len == 48 &&
	      (wc[0].wc_flags & IBV_WC_GRH) && wc[0].src_qp == p.qp[0]->qp_num &&
	      wc[0].qp_num == p.qp[1]->qp_num);
	CHECK(memcmp(r + 40, "datagram", 8) == 0);
	{
		struct ibv_grh *g = (struct ibv_grh *)r;

		CHECK(memcmp(&g->sgid, &p.gid, 16) == 0 && memcmp(&g->dgid, &p.gid, 16) == 0);
		CHECK(be16toh(g->paylen) == 8);
	}
	/* a full MTU works; one byte more is refused at post */
	CHECK(post_recv(p.qp[1], 3, r, 4096 + 40, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 4, p.buf, 4096, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].byte_len == 4096 + 40);
	CHECK(post_send(p.qp[0], 5, p.buf, 4097, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == EINVAL);
	/* wrong Q_Key and missing receive: dropped, the sender succeeds */
	{
		struct ibv_sge s = { (uintptr_t)p.buf, 8, p.mr->lkey };
		struct ibv_send_wr w = { .wr_id = 6, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED }, *bad;

		w.wr.ud.ah = p.ah;
		w.wr.ud.remote_qpn = p.qp[1]->qp_num;
		w.wr.ud.remote_qkey = 0x22222222;
		CHECK(post_recv(p.qp[1], 7, r, 4096 + 40, p.mr->lkey) == 0);
		CHECK(ibv_post_send(p.qp[0], &w, &bad) == 0);
		CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2 && wc[1].wr_id == 6 &&
		      wc[1].status == IBV_WC_SUCCESS);
		CHECK(poll_n(p.cq[1], wc, 1, 200) == 0);
		/* a Q_Key with the high bit set means the sender QP's own */
		w.wr_id = 8;
		w.wr.ud.remote_qkey = 0x80000000;
		CHECK(ibv_post_send(p.qp[0], &w, &bad) == 0);
		CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 7);
		CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 8);
	}
	CHECK(post_send(p.qp[0], 9, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(poll_n(p.cq[1], wc, 1, 200) == 0);
	/* an unknown destination QPN is just dropped */
	CHECK(post_send(p.qp[0], 10, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			0xfff0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	/* UD receive too small for GRH + payload: local length error */
	CHECK(post_recv(p.qp[1], 11, r, 40 + 7, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 12, p.buf, 8, p.mr->lkey, 0, p.ah, p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_LOC_LEN_ERR);
	CHECK(p.qp[1]->state == IBV_QPS_ERR);
	/* AH rules: Ethernet needs a GRH and a valid source GID index */
	{
		struct ibv_ah_attr a = { .is_global = 0, .port_num = 1 };

		CHECK(!ibv_create_ah(p.pd, &a));
		a.is_global = 1;
		a.grh.sgid_index = 77;
		CHECK(!ibv_create_ah(p.pd, &a));
	}
out:
	pair_close(&p);
}

/* The node's counter NAME from $FABRIC/stats/<node> (see stats.c), or -1. */
static long long stat_of(const char *name)
{
	char path[700];
	uint8_t b[16 + 64 * 32];
	ssize_t n;
	uint32_t cnt;
	int fd;

	snprintf(path, sizeof(path), "%s/stats/%s", fabric, node);
	fd = open(path, O_RDONLY);
	if (fd < 0)
		return -1;
	n = read(fd, b, sizeof(b));
	close(fd);
	if (n < 16 || memcmp(b, "SVSTATS1", 8) != 0)
		return -1;
	memcpy(&cnt, b + 8, 4);
	for (uint32_t i = 0; i < cnt && 16 + (i + 1) * 32 <= (size_t)n; i++) {
		uint64_t v;

		if (strncmp((char *)b + 16 + i * 32, name, 24) != 0)
			continue;
		memcpy(&v, b + 16 + i * 32 + 24, 8);
		return (long long)v;
	}
	return -1;
}

/* Every datagram the fabric loses is counted by reason, in a file others
 * read (the bench prints it when a run fails). */
static void t_drop_counters(void)
{
	struct pair p;
	struct ibv_wc wc[4];
	uint8_t *r;
	long long sent, deliv, norecv, noqp, qkey;

	CHECK(pair_open(&p, IBV_QPT_UD, 3 * 8192, &dflt) == 0);
	r = p.buf + 8192;
	sent = stat_of("ud_sent");
	deliv = stat_of("ud_delivered");
	norecv = stat_of("drop_no_recv");
	noqp = stat_of("drop_no_qp");
	qkey = stat_of("drop_qkey");
	CHECK(sent >= 0 && deliv >= 0 && norecv >= 0 && noqp >= 0 && qkey >= 0);
	/* delivered */
	CHECK(post_recv(p.qp[1], 1, r, 4096 + 40, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(stat_of("ud_delivered") == deliv + 1);
	/* no receive posted */
	CHECK(post_send(p.qp[0], 3, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	for (int i = 0; i < 300 && stat_of("drop_no_recv") == norecv; i++)
		usleep(10000);
	CHECK(stat_of("drop_no_recv") == norecv + 1);
	/* no such QP */
	CHECK(post_send(p.qp[0], 4, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			0xfff0) == 0);
	for (int i = 0; i < 300 && stat_of("drop_no_qp") == noqp; i++)
		usleep(10000);
	CHECK(stat_of("drop_no_qp") == noqp + 1);
	/* wrong Q_Key */
	{
		struct ibv_sge s = { (uintptr_t)p.buf, 8, p.mr->lkey };
		struct ibv_send_wr w = { .wr_id = 5, .sg_list = &s, .num_sge = 1,
					 .opcode = IBV_WR_SEND }, *bad;

		w.wr.ud.ah = p.ah;
		w.wr.ud.remote_qpn = p.qp[1]->qp_num;
		w.wr.ud.remote_qkey = 0x22222222;
		CHECK(post_recv(p.qp[1], 6, r, 4096 + 40, p.mr->lkey) == 0);
		CHECK(ibv_post_send(p.qp[0], &w, &bad) == 0);
		for (int i = 0; i < 300 && stat_of("drop_qkey") == qkey; i++)
			usleep(10000);
		CHECK(stat_of("drop_qkey") == qkey + 1);
	}
	CHECK(stat_of("ud_sent") == sent + 4);
	CHECK(stat_of("ud_delivered") == deliv + 1);
out:
	pair_close(&p);
}

/* A UD send with a bad key puts the QP in SQE; receives go on; SQE -> RTS. */
static void t_ud_sqe(void)
{
	struct pair p;
	struct ibv_wc wc[4];
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };

	CHECK(pair_open(&p, IBV_QPT_UD, 8192, &dflt) == 0);
	CHECK(post_send(p.qp[0], 1, p.buf, 8, 0x1234, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 8, p.mr->lkey, 0, p.ah, p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_LOC_PROT_ERR);
	CHECK(wc[1].wr_id == 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
	CHECK(p.qp[0]->state == IBV_QPS_SQE);
	CHECK(post_recv(p.qp[0], 3, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[1], 4, p.buf, 8, p.mr->lkey, 0, p.ah, p.qp[0]->qp_num) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 3 &&
	      wc[0].status == IBV_WC_SUCCESS);
	CHECK(ibv_modify_qp(p.qp[0], &a, IBV_QP_STATE) == 0);
	CHECK(post_send(p.qp[0], 5, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, p.ah,
			p.qp[1]->qp_num) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
out:
	pair_close(&p);
}

/* An RC QP accepts only its connected peer: a third QP aiming at it
 * (right QPN and GID, but not the peer it was connected to) is refused
 * and its sender gives up with RETRY_EXC_ERR. */
static void t_rc_stray_sender(void)
{
	struct conn_opts o = { 7, 1, 1, 1 };
	struct pair p;
	struct ibv_qp *stray = NULL;
	struct ibv_wc wc[2];

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	stray = make_qp(p.pd, p.cq[0], IBV_QPT_RC, NULL, 4);
	CHECK(stray && qp_init(stray) == 0);
	CHECK(qp_connect(stray, &p.gid, p.qp[1]->qp_num, &o) == 0);
	CHECK(post_recv(p.qp[1], 1, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(stray, 2, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 2 &&
	      wc[0].status == IBV_WC_RETRY_EXC_ERR);
	CHECK(poll_n(p.cq[1], wc, 1, 50) == 0);
	/* the real peer still gets through */
	CHECK(post_send(p.qp[0], 3, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 1);
out:
	if (stray)
		ibv_destroy_qp(stray);
	pair_close(&p);
}

/* ---- errors ---- */

static void t_bad_lkey(void)
{
	struct pair p;
	struct ibv_wc wc[4];

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	CHECK(post_recv(p.qp[1], 1, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 8, p.mr->lkey + 1, 0, NULL, 0) == 0);
	CHECK(post_send(p.qp[0], 3, p.buf, 8, p.mr->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 2 && wc[0].status == IBV_WC_LOC_PROT_ERR);
	CHECK(wc[1].wr_id == 3 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
	CHECK(p.qp[0]->state == IBV_QPS_ERR);
	CHECK(poll_n(p.cq[1], wc, 1, 200) == 0);
	/* posting to a QP in ERR: accepted, flushed at once */
	CHECK(post_send(p.qp[0], 4, p.buf, 8, p.mr->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 1000) == 1 && wc[0].status == IBV_WC_WR_FLUSH_ERR);
	pair_close(&p);

	/* a bad key on the receive side: receiver LOC_PROT_ERR, sender REM_OP_ERR */
	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	CHECK(post_recv(p.qp[1], 5, p.buf + 4096, 4096, 0x77) == 0);
	CHECK(post_recv(p.qp[1], 6, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 7, p.buf, 8, p.mr->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 5 && wc[0].status == IBV_WC_LOC_PROT_ERR);
	CHECK(wc[1].wr_id == 6 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_REM_OP_ERR);
out:
	pair_close(&p);
}

/* A send from an MR of another PD, and a receive into an MR without
 * LOCAL_WRITE, fail with protection errors. */
static void t_access_rights(void)
{
	struct pair p;
	struct ibv_wc wc[2];
	struct ibv_mr *ro = NULL, *other = NULL;
	struct ibv_pd *pd2 = NULL;

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	pd2 = ibv_alloc_pd(p.ctx);
	CHECK(pd2);
	other = ibv_reg_mr(pd2, p.buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(other);
	CHECK(post_send(p.qp[0], 1, p.buf, 8, other->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_LOC_PROT_ERR);
	ibv_dereg_mr(other);
	other = NULL;
	ibv_dealloc_pd(pd2);
	pd2 = NULL;
	pair_close(&p);

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	ro = ibv_reg_mr(p.pd, p.buf + 4096, 4096, 0);
	CHECK(ro);
	CHECK(post_recv(p.qp[1], 2, p.buf + 4096, 4096, ro->lkey) == 0);
	CHECK(post_send(p.qp[0], 3, p.buf, 8, p.mr->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 2 &&
	      wc[0].status == IBV_WC_LOC_PROT_ERR);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 3 &&
	      wc[0].status == IBV_WC_REM_OP_ERR);
out:
	if (other)
		ibv_dereg_mr(other);
	if (pd2)
		ibv_dealloc_pd(pd2);
	if (ro)
		ibv_dereg_mr(ro);
	pair_close(&p);
}

static void t_short_recv(void)
{
	struct pair p;
	struct ibv_wc wc[4];

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	CHECK(post_recv(p.qp[1], 1, p.buf + 4096, 16, p.mr->lkey) == 0);
	CHECK(post_recv(p.qp[1], 2, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 3, p.buf, 17, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(post_send(p.qp[0], 4, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_LOC_LEN_ERR);
	CHECK(wc[1].wr_id == 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
	CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 3 && wc[0].status == IBV_WC_REM_INV_REQ_ERR);
	CHECK(wc[1].wr_id == 4 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
	CHECK(p.qp[0]->state == IBV_QPS_ERR && p.qp[1]->state == IBV_QPS_ERR);
out:
	pair_close(&p);
}

/* Moving to ERR flushes every outstanding WR exactly once. */
static void t_flush_on_err(void)
{
	struct pair p;
	struct ibv_wc wc[64];
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
	int seen[40] = { 0 }, n;

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	/* qp[1] has no receives: sends to it are held there */
	for (int i = 0; i < 20; i++)
		CHECK(post_recv(p.qp[0], (uint64_t)i, p.buf, 64, p.mr->lkey) == 0);
	for (int i = 20; i < 40; i++)
		CHECK(post_send(p.qp[0], (uint64_t)i, p.buf, 64, p.mr->lkey,
				i & 1 ? IBV_SEND_SIGNALED : 0, NULL, 0) == 0);
	usleep(50000);
	CHECK(ibv_poll_cq(p.cq[0], 64, wc) == 0);
	CHECK(ibv_modify_qp(p.qp[0], &a, IBV_QP_STATE) == 0);
	n = poll_n(p.cq[0], wc, 64, 500);
	CHECK(n == 40);
	for (int i = 0; i < n; i++) {
		CHECK(wc[i].status == IBV_WC_WR_FLUSH_ERR && wc[i].wr_id < 40);
		CHECK(wc[i].opcode == (wc[i].wr_id < 20 ? IBV_WC_RECV : IBV_WC_SEND));
		seen[wc[i].wr_id]++;
	}
	for (int i = 0; i < 40; i++)
		CHECK(seen[i] == 1);
	/* RESET drops queued completions and WRs without new ones (qp[1] still
	 * holds qp[0]'s first message; a receive takes it) */
	CHECK(post_recv(p.qp[1], 100, p.buf, 64, p.mr->lkey) == 0);
	CHECK(post_recv(p.qp[1], 101, p.buf, 64, p.mr->lkey) == 0);
	usleep(50000);
	a.qp_state = IBV_QPS_RESET;
	CHECK(ibv_modify_qp(p.qp[1], &a, IBV_QP_STATE) == 0);
	CHECK(poll_n(p.cq[1], wc, 4, 100) == 0);
out:
	pair_close(&p);
}

/* Many WRs with mixed sizes: every one completes exactly once, in order. */
static void t_exactly_once(void)
{
	enum { N = 3000, DEPTH = 100 };
	struct pair p;
	static struct ibv_wc wc[256];
	static int sends[N], recvs[N];
	int posted_r = 0, posted_s = 0, done_r = 0, done_s = 0;
	uint64_t end = now_ms() + 15000;
	uint64_t last_s = 0;

	memset(sends, 0, sizeof(sends));
	memset(recvs, 0, sizeof(recvs));
	CHECK(pair_open(&p, IBV_QPT_RC, 65536, &dflt) == 0);
	while ((done_r < N || done_s < N) && now_ms() < end) {
		int n;

		while (posted_r < N && posted_r - done_r < DEPTH)
			CHECK(post_recv(p.qp[1], (uint64_t)posted_r++, p.buf + 32768,
					32768, p.mr->lkey) == 0);
		while (posted_s < N && posted_s - done_s < DEPTH) {
			uint32_t len = (uint32_t)((posted_s + 1) * 13) % 32768;

			CHECK(post_send(p.qp[0], (uint64_t)posted_s, p.buf, len,
					p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
			posted_s++;
		}
		n = ibv_poll_cq(p.cq[0], 256, wc);
		for (int i = 0; i < n; i++) {
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id < N);
			CHECK(done_s == 0 || wc[i].wr_id == last_s + 1);
			last_s = wc[i].wr_id;
			sends[wc[i].wr_id]++;
			done_s++;
		}
		n = ibv_poll_cq(p.cq[1], 256, wc);
		for (int i = 0; i < n; i++) {
			CHECK(wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id < N);
			CHECK(wc[i].byte_len == (uint32_t)((wc[i].wr_id + 1) * 13) % 32768);
			recvs[wc[i].wr_id]++;
			done_r++;
		}
	}
	CHECK(done_r == N && done_s == N);
	for (int i = 0; i < N; i++)
		CHECK(sends[i] == 1 && recvs[i] == 1);
	CHECK(ibv_poll_cq(p.cq[0], 1, wc) == 0 && ibv_poll_cq(p.cq[1], 1, wc) == 0);
out:
	pair_close(&p);
}

/* ---- SRQ ---- */

static void t_srq(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL, *scq = NULL;
	struct ibv_srq *srq = NULL;
	struct ibv_qp *qp[3] = { 0 };
	struct ibv_mr *mr = NULL;
	union ibv_gid gid;
	char *buf = calloc(1, 65536);
	struct ibv_wc wc[16];
	struct ibv_srq_attr sa;
	struct ibv_async_event ev;
	struct pollfd pfd;

	CHECK(c && buf);
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 64, NULL, NULL, 0);
	scq = ibv_create_cq(c, 64, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, buf, 65536, IBV_ACCESS_LOCAL_WRITE);
	CHECK(pd && cq && scq && mr && ibv_query_gid(c, 1, 1, &gid) == 0);
	{
		struct ibv_srq_init_attr ia = { .attr = { .max_wr = 8, .max_sge = 2 } };

		srq = ibv_create_srq(pd, &ia);
		CHECK(srq && ia.attr.max_wr == 8);
		ia.attr.max_wr = 1 << 20;
		CHECK(!ibv_create_srq(pd, &ia));
	}
	/* qp[0], qp[1] receive from the SRQ; qp[2] sends to both */
	for (int i = 0; i < 2; i++) {
		qp[i] = make_qp(pd, cq, IBV_QPT_RC, srq, 8);
		CHECK(qp[i] && qp_init(qp[i]) == 0);
	}
	CHECK(ibv_destroy_srq(srq) == EBUSY);
	CHECK(post_recv(qp[0], 1, buf, 8, mr->lkey) == EINVAL);
	qp[2] = make_qp(pd, scq, IBV_QPT_RC, NULL, 8);
	CHECK(qp[2] && qp_init(qp[2]) == 0);
	CHECK(qp_connect(qp[0], &gid, qp[2]->qp_num, &dflt) == 0);
	CHECK(qp_connect(qp[2], &gid, qp[0]->qp_num, &dflt) == 0);
	for (int i = 0; i < 8; i++) {
		struct ibv_sge s = { (uintptr_t)buf + 4096 * (i + 1), 4096, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *bad;

		CHECK(ibv_post_srq_recv(srq, &w, &bad) == 0);
	}
	{
		struct ibv_sge s = { (uintptr_t)buf, 8, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 999, .sg_list = &s, .num_sge = 1 }, *bad;

		CHECK(ibv_post_srq_recv(srq, &w, &bad) == ENOMEM && bad == &w);
	}
	/* arm the limit at 6: the third receive taken leaves 5 */
	sa.srq_limit = 6;
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0);
	CHECK(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 6 && sa.max_wr == 8);
	for (int i = 0; i < 3; i++)
		CHECK(post_send(qp[2], (uint64_t)i, buf, 32, mr->lkey, IBV_SEND_SIGNALED, NULL,
				0) == 0);
	CHECK(poll_n(scq, wc, 3, 3000) == 3);
	CHECK(poll_n(cq, wc, 3, 3000) == 3);
	for (int i = 0; i < 3; i++)
		CHECK(wc[i].wr_id == (uint64_t)(100 + i) && wc[i].qp_num == qp[0]->qp_num &&
		      wc[i].byte_len == 32);
	CHECK(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 0);
	pfd.fd = c->async_fd;
	pfd.events = POLLIN;
	CHECK(poll(&pfd, 1, 1000) == 1);
	CHECK(ibv_get_async_event(c, &ev) == 0);
	CHECK(ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq);
	ibv_ack_async_event(&ev);
	CHECK(poll(&pfd, 1, 0) == 0);
	/* now connect qp[1] instead and check its completions carry its QPN */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_RESET };

		CHECK(ibv_modify_qp(qp[2], &a, IBV_QP_STATE) == 0);
		CHECK(qp_init(qp[2]) == 0);
		CHECK(qp_connect(qp[2], &gid, qp[1]->qp_num, &dflt) == 0);
		CHECK(qp_connect(qp[1], &gid, qp[2]->qp_num, &dflt) == 0);
	}
	for (int i = 0; i < 5; i++)
		CHECK(post_send(qp[2], (uint64_t)i, buf, 16, mr->lkey, 0, NULL, 0) == 0);
	CHECK(poll_n(cq, wc, 5, 3000) == 5);
	for (int i = 0; i < 5; i++) {
		CHECK(wc[i].qp_num == qp[1]->qp_num && wc[i].wr_id == (uint64_t)(103 + i));
	}
	/* SRQ empty: an RC message waits for the next SRQ receive */
	CHECK(post_send(qp[2], 50, buf, 16, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(scq, wc, 1, 200) == 0);
	{
		struct ibv_sge s = { (uintptr_t)buf + 4096, 4096, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 200, .sg_list = &s, .num_sge = 1 }, *bad;

		CHECK(ibv_post_srq_recv(srq, &w, &bad) == 0);
	}
	CHECK(poll_n(cq, wc, 1, 3000) == 1 && wc[0].wr_id == 200);
	CHECK(poll_n(scq, wc, 1, 3000) == 1 && wc[0].wr_id == 50);
	/* an SRQ QP moved to ERR reports its last WQE; the SRQ keeps its WQEs */
	{
		struct ibv_qp_attr a = { .qp_state = IBV_QPS_ERR };
		struct ibv_sge s = { (uintptr_t)buf + 4096, 4096, mr->lkey };
		struct ibv_recv_wr w = { .wr_id = 300, .sg_list = &s, .num_sge = 1 }, *bad;

		CHECK(ibv_post_srq_recv(srq, &w, &bad) == 0);
		CHECK(ibv_modify_qp(qp[0], &a, IBV_QP_STATE) == 0);
		CHECK(ibv_get_async_event(c, &ev) == 0);
		CHECK(ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == qp[0]);
		CHECK(poll_n(cq, wc, 1, 100) == 0);
		sa.max_wr = 16;
		CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_MAX_WR) == 0);
		CHECK(ibv_query_srq(srq, &sa) == 0 && sa.max_wr == 16);
		sa.srq_limit = 17;
		CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == EINVAL);
	}
out:
	for (int i = 0; i < 3; i++)
		if (qp[i])
			ibv_destroy_qp(qp[i]);
	if (srq)
		ibv_destroy_srq(srq);
	if (mr)
		ibv_dereg_mr(mr);
	if (cq)
		ibv_destroy_cq(cq);
	if (scq)
		ibv_destroy_cq(scq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
	free(buf);
}

/* ---- completion channel ---- */

/*
 * The receiver of an event goes on using the CQ until it acks it (QEMU's
 * completion thread arms and polls it, then acks), even when the CQ is
 * destroyed meanwhile by another thread (a guest's vCPU): destroy returns
 * at once, the CQ stays safe to arm, poll and ack (it holds nothing), and
 * the last ack frees it. Freeing it at destroy was a use after free that
 * made QEMU die; the ASan build of this case (make test) catches that.
 */
static void t_cq_destroy_with_event_out(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_comp_channel *ch = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL, *cq2 = NULL, *ev_cq;
	struct ibv_qp *qp[2] = { 0 };
	struct ibv_mr *mr = NULL;
	union ibv_gid gid;
	char buf[4096];
	void *ev_ctx;
	struct ibv_wc wc[4];

	CHECK(c);
	ch = ibv_create_comp_channel(c);
	pd = ibv_alloc_pd(c);
	CHECK(ch && pd);
	cq = ibv_create_cq(c, 16, NULL, ch, 0);
	cq2 = ibv_create_cq(c, 16, NULL, ch, 0);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(cq && cq2 && mr && ibv_query_gid(c, 1, 1, &gid) == 0);
	for (int i = 0; i < 2; i++) {
		qp[i] = make_qp(pd, cq, IBV_QPT_RC, NULL, 8);
		CHECK(qp[i] && qp_init(qp[i]) == 0);
	}
	for (int i = 0; i < 2; i++)
		CHECK(qp_connect(qp[i], &gid, qp[1 - i]->qp_num, &dflt) == 0);
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(post_recv(qp[1], 1, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 2, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq);
	/* a completion arrives after the event was taken */
	CHECK(post_recv(qp[1], 3, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 4, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	usleep(100000);
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_destroy_qp(qp[i]) == 0);
		qp[i] = NULL;
	}
	/* destroyed while its event is out: returns at once */
	CHECK(ibv_destroy_cq(cq) == 0);
	/* the event's receiver still arms, polls and acks it, safely */
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(ibv_poll_cq(cq, 4, wc) == 0);
	ibv_ack_cq_events(cq, 1);
	cq = NULL;
	/* the channel works on for the other CQ, and is free to go */
	CHECK(ibv_destroy_cq(cq2) == 0);
	cq2 = NULL;
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	ch = NULL;
out:
	for (int i = 0; i < 2; i++)
		if (qp[i])
			ibv_destroy_qp(qp[i]);
	if (mr)
		ibv_dereg_mr(mr);
	if (cq)
		ibv_destroy_cq(cq);
	if (cq2)
		ibv_destroy_cq(cq2);
	if (ch)
		ibv_destroy_comp_channel(ch);
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
}

static void t_comp_channel(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_comp_channel *ch = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp[2] = { 0 };
	struct ibv_mr *mr = NULL;
	union ibv_gid gid;
	char buf[4096];
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	struct ibv_wc wc[4];
	struct pollfd pfd;
	int tag;

	CHECK(c);
	ch = ibv_create_comp_channel(c);
	pd = ibv_alloc_pd(c);
	CHECK(ch && pd && ch->fd >= 0);
	cq = ibv_create_cq(c, 16, &tag, ch, 0);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	CHECK(cq && mr && ibv_query_gid(c, 1, 1, &gid) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == EBUSY);
	for (int i = 0; i < 2; i++) {
		qp[i] = make_qp(pd, cq, IBV_QPT_RC, NULL, 8);
		CHECK(qp[i] && qp_init(qp[i]) == 0);
	}
	for (int i = 0; i < 2; i++)
		CHECK(qp_connect(qp[i], &gid, qp[1 - i]->qp_num, &dflt) == 0);
	/* the fd takes O_NONBLOCK: nothing queued -> EAGAIN */
	CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
	errno = 0;
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN);
	pfd.fd = ch->fd;
	pfd.events = POLLIN;
	/* not armed: a completion raises no event */
	CHECK(post_recv(qp[1], 1, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 2, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(cq, wc, 2, 3000) == 2);
	CHECK(poll(&pfd, 1, 100) == 0);
	/* armed: one event, then disarmed */
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(post_recv(qp[1], 3, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 4, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll(&pfd, 1, 3000) == 1 && (pfd.revents & POLLIN));
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq && ev_ctx == &tag);
	ibv_ack_cq_events(cq, 1);
	CHECK(poll_n(cq, wc, 2, 3000) == 2);
	CHECK(poll(&pfd, 1, 50) == 0);
	/* solicited-only: an unsolicited message does not fire, a solicited one does */
	CHECK(ibv_req_notify_cq(cq, 1) == 0);
	CHECK(post_recv(qp[1], 5, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 6, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(cq, wc, 2, 3000) == 2);
	CHECK(poll(&pfd, 1, 100) == 0);
	CHECK(post_recv(qp[1], 7, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 8, buf, 8, mr->lkey, IBV_SEND_SOLICITED, NULL, 0) == 0);
	CHECK(poll(&pfd, 1, 3000) == 1);
	CHECK(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == cq);
	ibv_ack_cq_events(cq, 1);
	CHECK(poll_n(cq, wc, 1, 3000) == 1 && wc[0].wr_id == 7);
	/* an event still queued when the CQ goes is withdrawn */
	CHECK(ibv_req_notify_cq(cq, 0) == 0);
	CHECK(post_recv(qp[1], 9, buf + 2048, 2048, mr->lkey) == 0);
	CHECK(post_send(qp[0], 10, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll(&pfd, 1, 3000) == 1);
	for (int i = 0; i < 2; i++) {
		CHECK(ibv_destroy_qp(qp[i]) == 0);
		qp[i] = NULL;
	}
	CHECK(ibv_destroy_cq(cq) == 0);
	cq = NULL;
	CHECK(poll(&pfd, 1, 0) == 0);
	CHECK(ibv_destroy_comp_channel(ch) == 0);
	ch = NULL;
out:
	for (int i = 0; i < 2; i++)
		if (qp[i])
			ibv_destroy_qp(qp[i]);
	if (cq)
		ibv_destroy_cq(cq);
	if (mr)
		ibv_dereg_mr(mr);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ch)
		ibv_destroy_comp_channel(ch);
	if (c)
		ibv_close_device(c);
}

/* QEMU's pattern: one thread posts, another waits on the channel, polls
 * and re-arms. */
struct thr {
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	int want, got, bad;
};

static void *waiter(void *arg)
{
	struct thr *t = arg;
	uint64_t end = now_ms() + 10000;

	while (t->got < t->want && now_ms() < end) {
		struct pollfd pfd = { .fd = t->ch->fd, .events = POLLIN };
		struct ibv_cq *cq;
		void *ctx;
		struct ibv_wc wc[2];
		int n;

		if (poll(&pfd, 1, 100) != 1)
			continue;
		if (ibv_get_cq_event(t->ch, &cq, &ctx))
			continue;
		ibv_req_notify_cq(cq, 0);
		while ((n = ibv_poll_cq(cq, 2, wc)) > 0)
			for (int i = 0; i < n; i++) {
				if (wc[i].status != IBV_WC_SUCCESS)
					t->bad++;
				t->got++;
			}
		ibv_ack_cq_events(cq, 1);
	}
	return NULL;
}

static void t_threads(void)
{
	enum { N = 400 };
	struct pair p;
	struct thr t = { 0 };
	pthread_t th;
	int started = 0;

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &dflt) == 0);
	/* both QPs complete into one channel-backed CQ: rebuild them */
	for (int i = 0; i < 2; i++) {
		ibv_destroy_qp(p.qp[i]);
		p.qp[i] = NULL;
	}
	t.ch = ibv_create_comp_channel(p.ctx);
	CHECK(t.ch && fcntl(t.ch->fd, F_SETFL, O_NONBLOCK) == 0);
	t.cq = ibv_create_cq(p.ctx, 64, NULL, t.ch, 0);
	CHECK(t.cq && ibv_req_notify_cq(t.cq, 0) == 0);
	for (int i = 0; i < 2; i++) {
		p.qp[i] = make_qp(p.pd, t.cq, IBV_QPT_RC, NULL, N);
		CHECK(p.qp[i] && qp_init(p.qp[i]) == 0);
	}
	for (int i = 0; i < 2; i++)
		CHECK(qp_connect(p.qp[i], &p.gid, p.qp[1 - i]->qp_num, &dflt) == 0);
	t.want = 2 * N;
	CHECK(pthread_create(&th, NULL, waiter, &t) == 0);
	started = 1;
	for (int i = 0; i < N; i++) {
		CHECK(post_recv(p.qp[1], (uint64_t)i, p.buf + 4096, 4096, p.mr->lkey) == 0);
		CHECK(post_send(p.qp[0], (uint64_t)i, p.buf, (uint32_t)i, p.mr->lkey,
				IBV_SEND_SIGNALED, NULL, 0) == 0);
		if (i % 50 == 0)
			usleep(1000);
	}
	pthread_join(th, NULL);
	started = 0;
	CHECK(t.got == 2 * N && t.bad == 0);
out:
	if (started)
		pthread_join(th, NULL);
	for (int i = 0; i < 2; i++)
		if (p.qp[i]) {
			ibv_destroy_qp(p.qp[i]);
			p.qp[i] = NULL;
		}
	if (t.cq)
		ibv_destroy_cq(t.cq);
	if (t.ch)
		ibv_destroy_comp_channel(t.ch);
	pair_close(&p);
}

/* ---- teardown with work outstanding ---- */

static void t_destroy_outstanding(void)
{
	struct conn_opts o = { 7, 2, 1, 1 }; /* short transport retry */
	struct pair p;
	struct ibv_wc wc[8];

	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &o) == 0);
	/* qp[1] has no receive, so it holds qp[0]'s message; qp[1]'s own
	 * message lands in qp[0]'s receive. Then the holder is destroyed. */
	CHECK(post_recv(p.qp[0], 1, p.buf, 64, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 64, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(post_send(p.qp[1], 3, p.buf, 64, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 3);
	usleep(20000);
	CHECK(ibv_destroy_qp(p.qp[1]) == 0);
	p.qp[1] = NULL;
	/* the sender retries a QP that is gone and gives up */
	CHECK(poll_n(p.cq[0], wc, 2, 3000) == 2);
	CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(wc[1].wr_id == 2 && wc[1].status == IBV_WC_RETRY_EXC_ERR);
	/* destroy a QP with queued sends and receives and a CQ full of entries */
	CHECK(post_recv(p.qp[0], 4, p.buf, 64, p.mr->lkey) == 0);
	CHECK(ibv_destroy_qp(p.qp[0]) == 0);
	p.qp[0] = NULL;
	CHECK(ibv_poll_cq(p.cq[0], 8, wc) == 0);
out:
	pair_close(&p);
}

/* Closing a context with everything still alive must not crash or leak. */
static void t_close_with_objects(void)
{
	struct pair p;
	struct ibv_comp_channel *ch;
	struct ibv_srq *srq;
	struct ibv_srq_init_attr ia = { .attr = { .max_wr = 4, .max_sge = 1 } };

	CHECK(pair_open(&p, IBV_QPT_UD, 8192, &dflt) == 0);
	ch = ibv_create_comp_channel(p.ctx);
	srq = ibv_create_srq(p.pd, &ia);
	CHECK(ch && srq);
	CHECK(post_recv(p.qp[1], 1, p.buf, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 8, p.mr->lkey, 0, p.ah, 0x1234) == 0);
	CHECK(ibv_close_device(p.ctx) == 0);
	free(p.buf);
	memset(&p, 0, sizeof(p));
out:
	pair_close(&p);
}

/* GIDs registered by others (gid.N + gid/<hex>) route like our own. */
static void t_registered_gid(void)
{
	struct conn_opts o = { 7, 7, 14, 5 };
	char path[1024], path2[1024], text[128];
	const char *hex = "fe80000000000000020c29fffe123456";
	struct pair p = { 0 };
	struct ibv_wc wc[2];

	make_fabric_dirs();
	snprintf(path, sizeof(path), "%s/node/%s/gid.5", fabric, node);
	snprintf(path2, sizeof(path2), "%s/gid/%s", fabric, hex);
	snprintf(text, sizeof(text), "%s\n", hex);
	write_text(path, text);
	snprintf(text, sizeof(text), "%s\n", node);
	write_text(path2, text);
	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &o) == 0);
	CHECK(p.gid.raw[15] == 0x56);
	CHECK(post_recv(p.qp[1], 1, p.buf + 4096, 4096, p.mr->lkey) == 0);
	CHECK(post_send(p.qp[0], 2, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_SUCCESS);
	pair_close(&p);
	/* a GID nobody registered: the RC send ends in RETRY_EXC_ERR */
	unlink(path2);
	o.retry_cnt = 1;
	o.timeout = 1;
	CHECK(pair_open(&p, IBV_QPT_RC, 8192, &o) == 0);
	CHECK(post_send(p.qp[0], 3, p.buf, 8, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].status == IBV_WC_RETRY_EXC_ERR);
out:
	pair_close(&p);
	unlink(path);
	unlink(path2);
}

/* ---- across processes ---- */

static int xwrite(int fd, const void *b, size_t n) { return write(fd, b, n) == (ssize_t)n ? 0 : -1; }

static int xread(int fd, void *b, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)b + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return 0;
}

struct peer_info {
	uint32_t qpn;
	union ibv_gid gid;
};

/* One side of a cross-process exchange: opens the device as node 'name',
 * makes a QP, swaps addresses over the pipes, then runs 'iters' rounds of
 * ping-pong (initiator sends first). Returns 0 on success. */
static int xproc_side(const char *name, enum ibv_qp_type t, int rfd, int wfd,
		      int initiator, int iters, uint32_t size)
{
	struct ibv_context *c;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_ah *ah = NULL;
	struct peer_info me, them;
	uint8_t *buf;
	struct ibv_wc wc[2];
	int ret = -1, grh = t == IBV_QPT_UD ? 40 : 0, line = 0, it = -1;

	setenv("SOFTVERBS_NODE", name, 1);
	buf = calloc(1, 2 * ((size_t)size + 64));
	c = open_dev();
	if (!c || !buf)
		return -1;
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 64, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, buf, 2 * ((size_t)size + 64), IBV_ACCESS_LOCAL_WRITE);
	qp = make_qp(pd, cq, t, NULL, 16);
	if (!pd || !cq || !mr || !qp || qp_init(qp))
		{ line = __LINE__; goto out; }
	me.qpn = qp->qp_num;
	if (ibv_query_gid(c, 1, 1, &me.gid))
		{ line = __LINE__; goto out; }
	if (xwrite(wfd, &me, sizeof(me)) || xread(rfd, &them, sizeof(them)))
		{ line = __LINE__; goto out; }
	if (qp_connect(qp, &them.gid, them.qpn, &dflt))
		{ line = __LINE__; goto out; }
	if (t == IBV_QPT_UD) {
		struct ibv_ah_attr a = { .is_global = 1, .port_num = 1,
					 .grh = { .dgid = them.gid, .sgid_index = 1 } };
		ah = ibv_create_ah(pd, &a);
		if (!ah)
			{ line = __LINE__; goto out; }
	}
	for (int i = 0; i < 4; i++)
		if (post_recv(qp, 1000 + i, buf + size + 64, size + grh, mr->lkey))
			{ line = __LINE__; goto out; }
	/* UD is unreliable: both sides post receives before either sends */
	{
		char ok = 1;
		if (xwrite(wfd, &ok, 1) || xread(rfd, &ok, 1))
			{ line = __LINE__; goto out; }
	}
	/* Ping-pong: the initiator sends message 0; each side answers every
	 * message it receives until both sent and received 'iters'. Message
	 * k carries k in its first byte and k+1 in its last. */
	{
		int nsent = 0, nrecv = 0, ncomp = 0;

		if (initiator) {
			buf[0] = 0;
			buf[size - 1] = 1;
			if (post_send(qp, 1, buf, size, mr->lkey, IBV_SEND_SIGNALED, ah,
				      them.qpn))
				{ line = __LINE__; goto out; }
			nsent++;
		}
		while (nrecv < iters || ncomp < iters) {
			uint8_t *r = buf + size + 64 + grh;

			it = nrecv;
			if (poll_n(cq, wc, 1, 5000) != 1 || wc[0].status != IBV_WC_SUCCESS)
				{ line = __LINE__; goto out; }
			if (wc[0].wr_id == 1) {
				ncomp++;
				continue;
			}
			if (wc[0].byte_len != size + grh || r[0] != (uint8_t)nrecv ||
			    r[size - 1] != (uint8_t)(nrecv + 1))
				{ line = __LINE__; goto out; }
			nrecv++;
			if (post_recv(qp, 1000, buf + size + 64, size + grh, mr->lkey))
				{ line = __LINE__; goto out; }
			if (nsent < iters) {
				buf[0] = (uint8_t)nsent;
				buf[size - 1] = (uint8_t)(nsent + 1);
				if (post_send(qp, 1, buf, size, mr->lkey, IBV_SEND_SIGNALED,
					      ah, them.qpn))
					{ line = __LINE__; goto out; }
				nsent++;
			}
		}
	}
	{
		char ok = 1; /* neither side leaves while the other still works */
		if (xwrite(wfd, &ok, 1) || xread(rfd, &ok, 1))
			{ line = __LINE__; goto out; }
	}
	ret = 0;
out:
	if (ret)
		fprintf(stderr, "%s: xproc_side failed at line %d, round %d (%s, wr %d)\n",
			name, line, it, ibv_wc_status_str(wc[0].status), (int)wc[0].wr_id);
	ibv_close_device(c);
	free(buf);
	return ret;
}

static void xproc(enum ibv_qp_type t, int iters, uint32_t size)
{
	int p2c[2], c2p[2], st = -1;
	pid_t pid = -1;

	CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		alarm(20);
		_exit(xproc_side("child", t, p2c[0], c2p[1], 0, iters, size) ? 1 : 0);
	}
	CHECK(xproc_side("parent", t, c2p[0], p2c[1], 1, iters, size) == 0);
	setenv("SOFTVERBS_NODE", node, 1);
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
out:
	setenv("SOFTVERBS_NODE", node, 1);
	if (st == -1 && pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	close(p2c[0]);
	close(p2c[1]);
	close(c2p[0]);
	close(c2p[1]);
}

static void t_xproc_rc(void) { xproc(IBV_QPT_RC, 200, 4096); }
static void t_xproc_rc_big(void) { xproc(IBV_QPT_RC, 10, 1 << 20); }
static void t_xproc_ud(void) { xproc(IBV_QPT_UD, 200, 1024); }

/* The peer process dies while we send: RC gives up with RETRY_EXC_ERR. */
static void t_peer_gone(void)
{
	int p2c[2], c2p[2];
	pid_t pid = -1;
	struct ibv_context *c = NULL;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp = NULL;
	struct ibv_mr *mr;
	struct peer_info me, them;
	char buf[256];
	struct ibv_wc wc[4];
	struct conn_opts o = { 7, 3, 1, 1 };

	CHECK(pipe(p2c) == 0 && pipe(c2p) == 0);
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* the child connects a QP and then dies without cleaning up */
		struct ibv_context *cc;
		struct ibv_qp *cqp;
		struct ibv_pd *cpd;
		struct ibv_cq *ccq;
		struct peer_info m, th;

		alarm(20);
		setenv("SOFTVERBS_NODE", "victim", 1);
		cc = open_dev();
		cpd = cc ? ibv_alloc_pd(cc) : NULL;
		ccq = cc ? ibv_create_cq(cc, 8, NULL, NULL, 0) : NULL;
		cqp = cpd && ccq ? make_qp(cpd, ccq, IBV_QPT_RC, NULL, 4) : NULL;
		if (!cqp || qp_init(cqp))
			_exit(1);
		m.qpn = cqp->qp_num;
		ibv_query_gid(cc, 1, 1, &m.gid);
		if (xwrite(c2p[1], &m, sizeof(m)) || xread(p2c[0], &th, sizeof(th)) ||
		    qp_connect(cqp, &th.gid, th.qpn, &o))
			_exit(1);
		xwrite(c2p[1], "k", 1);
		pause(); /* killed by the parent */
		_exit(0);
	}
	c = open_dev();
	CHECK(c);
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 8, NULL, NULL, 0);
	mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
	qp = make_qp(pd, cq, IBV_QPT_RC, NULL, 4);
	CHECK(qp && mr && qp_init(qp) == 0);
	me.qpn = qp->qp_num;
	CHECK(ibv_query_gid(c, 1, 1, &me.gid) == 0);
	CHECK(xread(c2p[0], &them, sizeof(them)) == 0 && xwrite(p2c[1], &me, sizeof(me)) == 0);
	CHECK(qp_connect(qp, &them.gid, them.qpn, &o) == 0);
	CHECK(xread(c2p[0], buf, 1) == 0);
	/* the first message is held by the live peer (no receive posted) */
	CHECK(post_send(qp, 1, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(post_send(qp, 2, buf, 8, mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(cq, wc, 1, 200) == 0);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	pid = -1;
	CHECK(poll_n(cq, wc, 2, 5000) == 2);
	CHECK(wc[0].wr_id == 1 && wc[0].status == IBV_WC_RETRY_EXC_ERR);
	CHECK(wc[1].wr_id == 2 && wc[1].status == IBV_WC_WR_FLUSH_ERR);
out:
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	if (c)
		ibv_close_device(c);
	close(p2c[0]);
	close(p2c[1]);
	close(c2p[0]);
	close(c2p[1]);
}

/* A socket file left by a killed process is replaced; a live node name
 * cannot be taken twice; a bad node name is refused. */
static int child_open_errno(const char *name, int wait_fd)
{
	pid_t pid;
	int st;

	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return -1;
	if (pid == 0) {
		struct ibv_device **l;
		struct ibv_context *c2;
		char b;

		if (wait_fd >= 0 && read(wait_fd, &b, 1) != 1)
			_exit(255);
		setenv("SOFTVERBS_NODE", name, 1);
		l = ibv_get_device_list(NULL);
		c2 = ibv_open_device(l[0]);
		_exit(c2 ? 0 : errno);
	}
	if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st))
		return -1;
	return WEXITSTATUS(st);
}

static void t_node_socket(void)
{
	char path[1024];
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct ibv_context *c = NULL;
	int fd;

	CHECK(child_open_errno("bad/name", -1) == EINVAL);
	make_fabric_dirs();
	snprintf(path, sizeof(path), "%s/node/%s/sock", fabric, node);
	unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	CHECK(strlen(path) < sizeof(a.sun_path));
	memcpy(a.sun_path, path, strlen(path) + 1);
	CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0);
	close(fd); /* stale: the file stays, nobody listens */
	CHECK(file_exists(path));
	c = open_dev();
	CHECK(c);
	/* forked with the device open: the child starts afresh, and finds
	 * the name taken by us */
	CHECK(child_open_errno(node, -1) == EADDRINUSE);
	CHECK(child_open_errno("otherchild", -1) == 0);
	/* two contexts in one process share the node */
	{
		struct ibv_context *c3 = open_dev();

		CHECK(c3);
		ibv_close_device(c3);
		CHECK(file_exists(path));
	}
out:
	if (c)
		ibv_close_device(c);
}

/* ---- calls that are not supported fail cleanly ---- */

static void t_unsupported(void)
{
	struct ibv_context *c = open_dev();
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;
	struct ibv_qp *qp = NULL;
	void *cm;

	CHECK(c);
	pd = ibv_alloc_pd(c);
	cq = ibv_create_cq(c, 4, NULL, NULL, 0);
	qp = make_qp(pd, cq, IBV_QPT_RC, NULL, 4);
	CHECK(pd && cq && qp);
	errno = 0;
	CHECK(!ibv_qp_to_qp_ex(qp) && errno == EOPNOTSUPP);
	errno = 0;
	CHECK(!ibv_alloc_mw(pd, IBV_MW_TYPE_1) && errno == EOPNOTSUPP);
	CHECK(ibv_attach_mcast(qp, NULL, 0) == EOPNOTSUPP);
	{
		struct ibv_device_attr_ex ax;
		struct ibv_cq_init_attr_ex cx = { .cqe = 4 };

		CHECK(ibv_query_device_ex(c, NULL, &ax) == 0 && ax.orig_attr.max_qp >= 1024);
		errno = 0;
		CHECK(!ibv_create_cq_ex(c, &cx) && errno == EOPNOTSUPP);
	}
	CHECK(ibv_resize_cq(cq, 64) == 0 && cq->cqe == 64);
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR), "unknown") != 0);
	CHECK(strcmp(ibv_wc_status_str((enum ibv_wc_status)999), "unknown") == 0);
	/* librdmacm: every call fails with ENOSYS */
	{
		char lib[1024];
		const char *out = getenv("OUT");
		void *(*create_ch)(void);
		int (*getai)(const char *, const char *, const void *, void **);
		void *res = (void *)1;

		snprintf(lib, sizeof(lib), "%s/librdmacm.so.1", out ? out : ".");
		cm = dlopen(lib, RTLD_NOW);
		CHECK(cm);
		create_ch = (void *(*)(void))dlsym(cm, "rdma_create_event_channel");
		getai = (int (*)(const char *, const char *, const void *, void **))dlsym(
			cm, "rdma_getaddrinfo");
		CHECK(create_ch && getai);
		errno = 0;
		CHECK(!create_ch() && errno == ENOSYS);
		errno = 0;
		CHECK(getai("x", "1", NULL, &res) == -1 && errno == ENOSYS && !res);
		dlclose(cm);
	}
out:
	if (qp)
		ibv_destroy_qp(qp);
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (c)
		ibv_close_device(c);
}

/*
 * A send to a peer QP that is still being connected (INIT) waits for it,
 * longer than retry_cnt transport timeouts would allow: the peer reaches
 * RTR 300 ms later, where retry_cnt 1 with a 10 ms timeout gave up after
 * 20 ms. A peer that does not exist still fails after retry_cnt timeouts.
 */
static void t_rc_peer_late(void)
{
	struct conn_opts o = { 7, 1, 1, 1 };
	struct pair p;
	struct ibv_qp *x = NULL, *y = NULL;
	struct ibv_wc wc[2];

	CHECK(pair_open(&p, IBV_QPT_RC, 4096, &o) == 0);
	x = make_qp(p.pd, p.cq[0], IBV_QPT_RC, NULL, 16);
	y = make_qp(p.pd, p.cq[1], IBV_QPT_RC, NULL, 16);
	CHECK(x && y && qp_init(x) == 0 && qp_init(y) == 0);
	CHECK(qp_connect(x, &p.gid, y->qp_num, &o) == 0);
	memcpy(p.buf, "late", 4);
	CHECK(post_send(x, 1, p.buf, 4, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 300) == 0); /* still waiting, not failed */
	CHECK(post_recv(y, 2, p.buf + 100, 100, p.mr->lkey) == 0);
	CHECK(qp_connect(y, &p.gid, x->qp_num, &o) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 1 &&
	      wc[0].status == IBV_WC_SUCCESS);
	CHECK(poll_n(p.cq[1], wc, 1, 3000) == 1 && wc[0].wr_id == 2 &&
	      memcmp(p.buf + 100, "late", 4) == 0);
	/* No such QP: retry_cnt timeouts, then RETRY_EXC_ERR (the 10 s
	 * patience for a connecting peer would outlast the 3 s poll). */
	CHECK(ibv_destroy_qp(y) == 0);
	y = NULL;
	CHECK(post_send(x, 3, p.buf, 4, p.mr->lkey, IBV_SEND_SIGNALED, NULL, 0) == 0);
	CHECK(poll_n(p.cq[0], wc, 1, 3000) == 1 && wc[0].wr_id == 3 &&
	      wc[0].status == IBV_WC_RETRY_EXC_ERR);
out:
	if (x)
		ibv_destroy_qp(x);
	if (y)
		ibv_destroy_qp(y);
	pair_close(&p);
}

int main(int argc, char **argv)
{
	const char *f = getenv("SOFTVERBS_FABRIC");

	if (f && *f) {
		snprintf(fabric, sizeof(fabric), "%s", f);
	} else {
		char tmpl[] = "/tmp/softverbs-unit.XXXXXX";

		if (!mkdtemp(tmpl))
			return 1;
		snprintf(fabric, sizeof(fabric), "%s", tmpl);
		setenv("SOFTVERBS_FABRIC", fabric, 1);
	}
	setenv("SOFTVERBS_NODE", node, 1);
	signal(SIGPIPE, SIG_IGN);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc > 1)
		only = argv + 1;

	run("device_list", t_device_list);
	run("query_device", t_query_device);
	run("query_port", t_query_port);
	run("query_gid", t_query_gid);
	run("mr", t_mr);
	run("mr_bounds", t_mr_bounds);
	run("qp_states", t_qp_states);
	run("rc_loopback", t_rc_loopback);
	run("rc_inline", t_rc_inline);
	run("rc_rnr_hold", t_rc_rnr_hold);
	run("rc_rnr_exceeded", t_rc_rnr_exceeded);
	run("rc_window_rnr", t_rc_window_rnr);
	run("rc_rnr_retry_after_poll", t_rc_rnr_retry_after_poll);
	run("rc_peer_late", t_rc_peer_late);
	run("rc_stray_sender", t_rc_stray_sender);
	run("uc_loopback", t_uc_loopback);
	run("ud_loopback", t_ud_loopback);
	run("ud_sqe", t_ud_sqe);
	run("drop_counters", t_drop_counters);
	run("bad_lkey", t_bad_lkey);
	run("access_rights", t_access_rights);
	run("short_recv", t_short_recv);
	run("flush_on_err", t_flush_on_err);
	run("exactly_once", t_exactly_once);
	run("srq", t_srq);
	run("comp_channel", t_comp_channel);
	run("cq_destroy_with_event_out", t_cq_destroy_with_event_out);
	run("threads", t_threads);
	run("destroy_outstanding", t_destroy_outstanding);
	run("close_with_objects", t_close_with_objects);
	run("registered_gid", t_registered_gid);
	run("xproc_rc", t_xproc_rc);
	run("xproc_rc_1MiB", t_xproc_rc_big);
	run("xproc_ud", t_xproc_ud);
	run("peer_gone", t_peer_gone);
	run("node_socket", t_node_socket);
	run("unsupported", t_unsupported);

	printf("unit: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
