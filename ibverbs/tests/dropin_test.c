/*
 * The drop-in's conformance test: a verbs program linked against
 * build/vfrdma/libibverbs.so.1, run on the model (VFRDMA_MODEL=v20) by
 * ibverbs' Go test. Each check prints "ok NAME" or "FAIL NAME: why"; the
 * exit status is the number of failures.
 */
#define _GNU_SOURCE
#include <infiniband/verbs.h>

/* libibverbs exports it; verbs.h does not declare it. */
int ibv_query_gid_type(struct ibv_context *context, uint8_t port_num, unsigned int index, unsigned int *type);

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int failures;

#define CHECK(name, cond, ...) do { \
	if (cond) { printf("ok %s\n", name); } \
	else { printf("FAIL %s: ", name); printf(__VA_ARGS__); printf("\n"); failures++; } \
} while (0)
#define REQUIRE(name, cond, ...) do { \
	int ok_ = !!(cond); \
	CHECK(name, ok_, __VA_ARGS__); \
	if (!ok_) { fflush(stdout); exit(100 + failures); } \
} while (0)

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static union ibv_gid gid0;

/* Polls cq until n completions arrived (or a generous bound: a hang). */
static int poll_n(struct ibv_cq *cq, struct ibv_wc *wc, int n)
{
	int got = 0;
	struct timespec start, now;

	clock_gettime(CLOCK_MONOTONIC, &start);
	while (got < n) {
		int r = ibv_poll_cq(cq, n - got, wc + got);
		if (r < 0)
			return r;
		got += r;
		clock_gettime(CLOCK_MONOTONIC, &now);
		if (now.tv_sec - start.tv_sec > 60)
			break;
	}
	return got;
}

static struct ibv_qp *make_qp(enum ibv_qp_type type, struct ibv_cq *scq, struct ibv_cq *rcq,
			      struct ibv_srq *srq, int depth, int sge)
{
	struct ibv_qp_init_attr a = {
		.send_cq = scq, .recv_cq = rcq, .srq = srq, .qp_type = type, .sq_sig_all = 1,
		.cap = { .max_send_wr = depth, .max_recv_wr = depth, .max_send_sge = sge, .max_recv_sge = sge },
	};
	return ibv_create_qp(pd, &a);
}

static int to_init(struct ibv_qp *qp, int ud)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, .qkey = 0x11111111 };
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			     (ud ? IBV_QP_QKEY : IBV_QP_ACCESS_FLAGS));
}

static int rc_connect(struct ibv_qp *qp, uint32_t dest)
{
	struct ibv_qp_attr a;
	int r = to_init(qp, 0);

	if (r)
		return r;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid0;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	r = ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
	if (r)
		return r;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void test_device(void)
{
	struct ibv_device_attr da;
	struct ibv_device_attr_ex dx;
	struct ibv_port_attr pa;
	unsigned int type = 9;

	CHECK("query_device", ibv_query_device(ctx, &da) == 0 && da.max_qp > 0 && da.phys_port_cnt == 1 &&
	      da.vendor_id == 0x15ad, "max_qp %d ports %d vendor %#x", da.max_qp, da.phys_port_cnt, da.vendor_id);
	memset(&dx, 0xff, sizeof(dx));
	CHECK("query_device_ex", ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.orig_attr.max_qp == da.max_qp &&
	      dx.orig_attr.max_sge == da.max_sge, "max_qp %d", dx.orig_attr.max_qp);
	CHECK("query_port active", ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
	      pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len > 0, "state %d", pa.state);
	CHECK("query_port 2 is EINVAL", ibv_query_port(ctx, 2, &pa) == EINVAL, "port 2 answered");
	CHECK("query_gid 0", ibv_query_gid(ctx, 1, 0, &gid0) == 0 && gid0.raw[0] == 0xfe, "gid %02x", gid0.raw[0]);
	CHECK("query_gid past the table is EINVAL", ibv_query_gid(ctx, 1, pa.gid_tbl_len, &gid0 + 0) == -1 &&
	      errno == EINVAL, "errno %d", errno);
	ibv_query_gid(ctx, 1, 0, &gid0);
	CHECK("query_gid_type", ibv_query_gid_type(ctx, 1, 0, &type) == 0 && type == 0, "type %u", type);
	{
		__be16 pkey = 0;
		CHECK("query_pkey 0 is the default P_Key", ibv_query_pkey(ctx, 1, 0, &pkey) == 0 && ntohs(pkey) == 0xffff,
		      "pkey %#x", ntohs(pkey));
		CHECK("query_pkey past the one-entry table is EINVAL", ibv_query_pkey(ctx, 1, 1, &pkey) == -1 && errno == EINVAL,
		      "errno %d", errno);
		CHECK("get_pkey_index of the default P_Key", ibv_get_pkey_index(ctx, 1, htons(0xffff)) == 0, "index");
	}
	{
		struct ibv_gid_entry e, tbl[8];
		ssize_t n = ibv_query_gid_table(ctx, tbl, 8, 0);
		CHECK("query_gid_ex", ibv_query_gid_ex(ctx, 1, 0, &e, 0) == 0 && e.gid_type == IBV_GID_TYPE_ROCE_V1 &&
		      memcmp(&e.gid, &gid0, 16) == 0, "entry");
		CHECK("query_gid_table", n >= 1 && memcmp(&tbl[0].gid, &gid0, 16) == 0, "n %zd", n);
	}
}

static void test_mr(void)
{
	char *raw = malloc(10000);
	struct ibv_mr *mr = ibv_reg_mr(pd, raw + 3, 5000, IBV_ACCESS_LOCAL_WRITE);

	CHECK("reg_mr of unaligned malloc'd memory", mr && mr->addr == raw + 3 && mr->length == 5000 && mr->lkey,
	      "errno %d", errno);
	if (mr)
		CHECK("dereg_mr", ibv_dereg_mr(mr) == 0, "dereg");
	mr = ibv_reg_mr(pd, raw, 100, 1 << 12);
	CHECK("reg_mr with unknown access is EINVAL", !mr && errno == EINVAL, "errno %d", errno);
	mr = ibv_reg_mr_iova(pd, raw + 3, 100, 0x10000 + ((uintptr_t)(raw + 3) & 0xfff), IBV_ACCESS_LOCAL_WRITE);
	CHECK("reg_mr_iova at the memory's page offset", mr && mr->lkey, "errno %d", errno);
	if (mr)
		ibv_dereg_mr(mr);
	mr = ibv_reg_mr_iova(pd, raw + 3, 100, 0x10000 + (((uintptr_t)(raw + 3) + 1) & 0xfff), IBV_ACCESS_LOCAL_WRITE);
	CHECK("reg_mr_iova at another page offset is EINVAL", !mr && errno == EINVAL, "errno %d", errno);
	free(raw);
}

/* Two RC QPs of the context connected to each other: send/recv, data checked. */
static void test_rc(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, 16, 2);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, cq, cq, NULL, 16, 2);
	char *sbuf = malloc(8192), *rbuf = malloc(8192);
	struct ibv_mr *smr, *rmr;
	struct ibv_sge ss[2], rs;
	struct ibv_send_wr sw, *bad = NULL;
	struct ibv_recv_wr rw, *rbad = NULL;
	struct ibv_wc wc[4];
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	int r, n;

	REQUIRE("rc create", cq && a && b, "errno %d", errno);
	smr = ibv_reg_mr(pd, sbuf + 1, 4000, IBV_ACCESS_LOCAL_WRITE);
	rmr = ibv_reg_mr(pd, rbuf + 5, 4000, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	REQUIRE("rc mrs", smr && rmr, "errno %d", errno);

	/* A post on a RESET QP: EINVAL, bad_wr at it. */
	memset(&sw, 0, sizeof(sw));
	ss[0] = (struct ibv_sge){ .addr = (uintptr_t)(sbuf + 1), .length = 100, .lkey = smr->lkey };
	sw.wr_id = 1; sw.sg_list = ss; sw.num_sge = 1; sw.opcode = IBV_WR_SEND; sw.send_flags = IBV_SEND_SIGNALED;
	r = ibv_post_send(a, &sw, &bad);
	CHECK("post_send on a RESET QP is EINVAL at bad_wr", r == EINVAL && bad == &sw, "r %d", r);

	CHECK("rc connect a", rc_connect(a, b->qp_num) == 0, "errno %d", errno);
	CHECK("rc connect b", rc_connect(b, a->qp_num) == 0, "errno %d", errno);
	CHECK("query_qp RTS", ibv_query_qp(a, &qa, IBV_QP_STATE, &qi) == 0 && qa.qp_state == IBV_QPS_RTS &&
	      qa.dest_qp_num == b->qp_num && qi.cap.max_send_wr >= 16, "state %d", qa.qp_state);

	for (int i = 0; i < 4000; i++)
		sbuf[1 + i] = (char)(i * 7 + 1);
	memset(rbuf, 0, 8192);
	rs = (struct ibv_sge){ .addr = (uintptr_t)(rbuf + 5), .length = 4000, .lkey = rmr->lkey };
	memset(&rw, 0, sizeof(rw));
	rw.wr_id = 77; rw.sg_list = &rs; rw.num_sge = 1;
	CHECK("post_recv", ibv_post_recv(b, &rw, &rbad) == 0, "post_recv");
	/* two SGEs: 1000 + 3000 bytes */
	ss[0] = (struct ibv_sge){ .addr = (uintptr_t)(sbuf + 1), .length = 1000, .lkey = smr->lkey };
	ss[1] = (struct ibv_sge){ .addr = (uintptr_t)(sbuf + 1001), .length = 3000, .lkey = smr->lkey };
	sw.num_sge = 2; sw.wr_id = 5; sw.opcode = IBV_WR_SEND_WITH_IMM; sw.imm_data = htonl(0x01020304);
	CHECK("post_send", ibv_post_send(a, &sw, &bad) == 0, "post_send");
	n = poll_n(cq, wc, 2);
	CHECK("rc completions", n == 2, "n %d", n);
	for (int i = 0; i < n; i++) {
		if (wc[i].opcode == IBV_WC_RECV) {
			CHECK("rc recv wc", wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == 77 && wc[i].byte_len == 4000 &&
			      wc[i].qp_num == b->qp_num && (wc[i].wc_flags & IBV_WC_WITH_IMM) &&
			      ntohl(wc[i].imm_data) == 0x01020304,
			      "status %d wr_id %llu len %u qp %u flags %#x imm %#x", wc[i].status,
			      (unsigned long long)wc[i].wr_id, wc[i].byte_len, wc[i].qp_num, wc[i].wc_flags, ntohl(wc[i].imm_data));
		} else {
			CHECK("rc send wc", wc[i].status == IBV_WC_SUCCESS && wc[i].wr_id == 5 && wc[i].opcode == IBV_WC_SEND &&
			      wc[i].qp_num == a->qp_num, "status %d opcode %d", wc[i].status, wc[i].opcode);
		}
	}
	CHECK("rc data", memcmp(sbuf + 1, rbuf + 5, 4000) == 0, "data differs");

	/* RDMA WRITE and READ name the peer's memory by its virtual address */
	memset(rbuf + 5, 0, 4000);
	ss[0] = (struct ibv_sge){ .addr = (uintptr_t)(sbuf + 11), .length = 333, .lkey = smr->lkey };
	sw.num_sge = 1; sw.wr_id = 6; sw.opcode = IBV_WR_RDMA_WRITE;
	sw.wr.rdma.remote_addr = (uintptr_t)(rbuf + 5 + 1234); sw.wr.rdma.rkey = rmr->rkey;
	CHECK("post rdma write", ibv_post_send(a, &sw, &bad) == 0, "post");
	n = poll_n(cq, wc, 1);
	CHECK("rdma write lands at the peer's virtual address", n == 1 && wc[0].status == IBV_WC_SUCCESS &&
	      wc[0].opcode == IBV_WC_RDMA_WRITE && memcmp(rbuf + 5 + 1234, sbuf + 11, 333) == 0,
	      "n %d status %d opcode %d", n, n > 0 ? wc[0].status : -1, n > 0 ? wc[0].opcode : -1);
	memset(sbuf + 2001, 0, 100);
	ss[0] = (struct ibv_sge){ .addr = (uintptr_t)(sbuf + 2001), .length = 100, .lkey = smr->lkey };
	sw.wr_id = 7; sw.opcode = IBV_WR_RDMA_READ; sw.wr.rdma.remote_addr = (uintptr_t)(rbuf + 5 + 1234);
	CHECK("post rdma read", ibv_post_send(a, &sw, &bad) == 0, "post");
	n = poll_n(cq, wc, 1);
	CHECK("rdma read reads the peer's virtual address", n == 1 && wc[0].status == IBV_WC_SUCCESS &&
	      wc[0].opcode == IBV_WC_RDMA_READ && memcmp(sbuf + 2001, sbuf + 11, 100) == 0, "n %d", n);
	sw.opcode = IBV_WR_SEND;

	/* errors: bad lkey, too many SGEs, a full queue; the ones before are posted */
	{
		struct ibv_send_wr w[3];
		struct ibv_sge g[5];
		for (int i = 0; i < 5; i++)
			g[i] = (struct ibv_sge){ .addr = (uintptr_t)(sbuf + 1), .length = 8, .lkey = smr->lkey };
		memset(w, 0, sizeof(w));
		for (int i = 0; i < 3; i++) {
			w[i].wr_id = 100 + i; w[i].sg_list = g; w[i].num_sge = 1; w[i].opcode = IBV_WR_SEND;
			w[i].next = i < 2 ? &w[i + 1] : NULL;
		}
		w[1].num_sge = 3; /* the QP takes 2 */
		rw.wr_id = 200; rs.length = 4000;
		ibv_post_recv(b, &rw, &rbad);
		r = ibv_post_send(a, &w[0], &bad);
		CHECK("too many SGEs is EINVAL at bad_wr, the one before posted", r == EINVAL && bad == &w[1], "r %d", r);
		n = poll_n(cq, wc, 2);
		CHECK("the request before the refused one completes", n == 2, "n %d", n);

		w[0].num_sge = 1; w[0].next = NULL;
		g[0].lkey = 0xdead;
		r = ibv_post_send(a, &w[0], &bad);
		CHECK("a bad lkey is EINVAL at bad_wr", r == EINVAL && bad == &w[0], "r %d", r);
		g[0].lkey = smr->lkey;
	}
	{
		/* 17 sends on a 16-deep queue with nobody receiving: the 17th is ENOMEM */
		struct ibv_send_wr w[17];
		struct ibv_sge g = { .addr = (uintptr_t)(sbuf + 1), .length = 8, .lkey = smr->lkey };
		struct ibv_qp_attr ea = { .qp_state = IBV_QPS_ERR };
		int depth;

		ibv_query_qp(a, &qa, IBV_QP_CAP, &qi);
		depth = qa.cap.max_send_wr;
		memset(w, 0, sizeof(w));
		for (int i = 0; i < 17; i++) {
			w[i].wr_id = 300 + i; w[i].sg_list = &g; w[i].num_sge = 1; w[i].opcode = IBV_WR_SEND;
			w[i].next = i < 16 ? &w[i + 1] : NULL;
		}
		r = depth == 16 ? ibv_post_send(a, &w[0], &bad) : -1;
		CHECK("a full queue is ENOMEM at bad_wr, the ones before posted", r == ENOMEM && bad == &w[16],
		      "r %d depth %d", r, depth);
		CHECK("modify to ERR", ibv_modify_qp(a, &ea, IBV_QP_STATE) == 0, "errno");
		{
			struct ibv_wc fw[32];
			int flushed = 0, total = poll_n(cq, fw, 16);
			for (int i = 0; i < total; i++)
				flushed += fw[i].status == IBV_WC_WR_FLUSH_ERR || fw[i].status != IBV_WC_SUCCESS;
			CHECK("ERR flushes what was outstanding, each once", total == 16, "total %d flushed %d", total, flushed);
		}
	}
	CHECK("destroy a CQ in use is EBUSY", ibv_destroy_cq(cq) == EBUSY, "destroy");
	CHECK("dealloc a PD in use is EBUSY", ibv_dealloc_pd(pd) == EBUSY, "dealloc");
	CHECK("destroy qp a", ibv_destroy_qp(a) == 0, "destroy a");
	CHECK("destroy qp b", ibv_destroy_qp(b) == 0, "destroy b");
	CHECK("destroy cq", ibv_destroy_cq(cq) == 0, "destroy cq");
	ibv_dereg_mr(smr);
	ibv_dereg_mr(rmr);
	free(sbuf);
	free(rbuf);
}

struct poster {
	struct ibv_qp *qp;
	struct ibv_sge *sge;
	int first, n, failed;
};

static void *post_recvs(void *arg)
{
	struct poster *p = arg;

	for (int i = 0; i < p->n; i++) {
		struct ibv_recv_wr w = { .wr_id = (uint64_t)(p->first + i), .sg_list = p->sge, .num_sge = 1 }, *bad;
		p->failed += ibv_post_recv(p->qp, &w, &bad) != 0;
	}
	return NULL;
}

/* Two threads post receives to one QP at once (the verbs allow it): every
 * one is posted once, with its own wr_id. */
static void test_threads(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, 128, 1), *b = make_qp(IBV_QPT_RC, cq, cq, NULL, 128, 1);
	char *buf = malloc(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 8, .lkey = mr ? mr->lkey : 0 };
	struct poster p[2] = { { b, &s, 0, 64, 0 }, { b, &s, 64, 64, 0 } };
	pthread_t t[2];
	struct ibv_wc wc[256];
	int seen[128] = { 0 }, n, recvs = 0, dup = 0;

	REQUIRE("threads setup", cq && a && b && mr && rc_connect(a, b->qp_num) == 0 && rc_connect(b, a->qp_num) == 0,
		"errno %d", errno);
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, post_recvs, &p[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	CHECK("receives posted from two threads at once", p[0].failed + p[1].failed == 0, "failed %d", p[0].failed + p[1].failed);
	for (int i = 0; i < 128; i++) {
		struct ibv_send_wr w = { .wr_id = 1000, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND }, *bad;
		if (ibv_post_send(a, &w, &bad) != 0)
			break;
		if (i % 32 == 31) { /* keep the send queue from filling */
			int got = poll_n(cq, wc, 64);
			for (int j = 0; j < got; j++)
				if (wc[j].opcode == IBV_WC_RECV && wc[j].status == 0 && wc[j].wr_id < 128) {
					dup += seen[wc[j].wr_id]++;
					recvs++;
				}
		}
	}
	n = recvs;
	CHECK("each receive completes once with its own wr_id", n == 128 && dup == 0, "recvs %d dup %d", n, dup);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	free(buf);
}

/* Inline sends: the bytes of unregistered memory, copied at post; the
 * QP's max_inline_data is the limit. */
static void test_inline(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 2, .max_recv_sge = 1, .max_inline_data = 60 } };
	struct ibv_qp *a = ibv_create_qp(pd, &ia), *b = make_qp(IBV_QPT_RC, cq, cq, NULL, 4, 1);
	char *rbuf = malloc(4096), msg[200];
	struct ibv_mr *mr = ibv_reg_mr(pd, rbuf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge s[2], r;
	struct ibv_send_wr sw, *bad;
	struct ibv_recv_wr rw, *rbad;
	struct ibv_wc wc[2];
	int n, limit;

	REQUIRE("inline qp", cq && a && b && mr && ia.cap.max_inline_data >= 60, "errno %d inline %u", errno,
		ia.cap.max_inline_data);
	limit = ia.cap.max_inline_data;
	REQUIRE("inline connect", rc_connect(a, b->qp_num) == 0 && rc_connect(b, a->qp_num) == 0, "errno %d", errno);
	for (int round = 0; round < 6; round++) { /* more rounds than slots */
		for (int i = 0; i < limit; i++)
			msg[i] = (char)(i + round);
		memset(rbuf, 0, 4096);
		r = (struct ibv_sge){ .addr = (uintptr_t)rbuf, .length = 4096, .lkey = mr->lkey };
		memset(&rw, 0, sizeof(rw)); rw.sg_list = &r; rw.num_sge = 1;
		ibv_post_recv(b, &rw, &rbad);
		s[0] = (struct ibv_sge){ .addr = (uintptr_t)msg, .length = 10, .lkey = 0 };
		s[1] = (struct ibv_sge){ .addr = (uintptr_t)(msg + 10), .length = limit - 10, .lkey = 0 };
		memset(&sw, 0, sizeof(sw)); sw.sg_list = s; sw.num_sge = 2; sw.opcode = IBV_WR_SEND;
		sw.send_flags = IBV_SEND_INLINE;
		n = ibv_post_send(a, &sw, &bad);
		memset(msg, 0xee, limit); /* the bytes were taken at post */
		if (n == 0)
			n = poll_n(cq, wc, 2);
		for (int i = 0; i < limit; i++)
			msg[i] = (char)(i + round);
		if (n != 2 || memcmp(rbuf, msg, limit) != 0)
			break;
	}
	CHECK("inline sends at max_inline_data carry their bytes", n == 2 && memcmp(rbuf, msg, limit) == 0, "n %d", n);
	s[1].length = limit - 10 + 1;
	CHECK("inline data one past max_inline_data is EINVAL", ibv_post_send(a, &sw, &bad) == EINVAL && bad == &sw, "past");
	ia.cap.max_inline_data = 513;
	CHECK("a QP asking more inline data than the drop-in takes is EINVAL", !ibv_create_qp(pd, &ia) && errno == EINVAL,
	      "errno %d", errno);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	free(rbuf);
}

/* The completion channel: poll(2) on its fd, ibv_get_cq_event, ack. */
static void test_channel(void)
{
	struct ibv_comp_channel *ch = ibv_create_comp_channel(ctx);
	struct ibv_cq *cq1, *cq2, *ev = NULL;
	struct ibv_qp *a, *b;
	char *buf = malloc(4096);
	struct ibv_mr *mr;
	struct ibv_sge s;
	struct ibv_send_wr sw, *bad;
	struct ibv_recv_wr rw, *rbad;
	struct ibv_wc wc[2];
	struct pollfd pfd;
	void *cqctx = NULL;
	int r, fl;

	REQUIRE("channel create", ch && ch->fd >= 0, "errno %d", errno);
	cq1 = ibv_create_cq(ctx, 16, (void *)0x1234, ch, 0);
	cq2 = ibv_create_cq(ctx, 16, NULL, ch, 0);
	REQUIRE("channel cqs", cq1 && cq2, "errno %d", errno);
	a = make_qp(IBV_QPT_RC, cq2, cq2, NULL, 8, 1);
	b = make_qp(IBV_QPT_RC, cq2, cq1, NULL, 8, 1);
	REQUIRE("channel qps", a && b && rc_connect(a, b->qp_num) == 0 && rc_connect(b, a->qp_num) == 0, "errno %d", errno);
	mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK("req_notify_cq", ibv_req_notify_cq(cq1, 0) == 0, "arm");
	fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	r = ibv_get_cq_event(ch, &ev, &cqctx);
	CHECK("a non-blocking channel with nothing is EAGAIN", r == -1 && errno == EAGAIN, "r %d errno %d", r, errno);
	fcntl(ch->fd, F_SETFL, fl);

	s = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	memset(&rw, 0, sizeof(rw)); rw.wr_id = 1; rw.sg_list = &s; rw.num_sge = 1;
	ibv_post_recv(b, &rw, &rbad);
	memset(&sw, 0, sizeof(sw)); sw.wr_id = 2; sw.sg_list = &s; sw.num_sge = 1; sw.opcode = IBV_WR_SEND;
	ibv_post_send(a, &sw, &bad);
	pfd = (struct pollfd){ .fd = ch->fd, .events = POLLIN };
	r = poll(&pfd, 1, 60000);
	CHECK("the channel fd is readable after a completion", r == 1 && (pfd.revents & POLLIN), "poll %d", r);
	r = ibv_get_cq_event(ch, &ev, &cqctx);
	CHECK("get_cq_event returns the CQ that fired", r == 0 && ev == cq1 && cqctx == (void *)0x1234, "r %d ev %p", r, (void *)ev);
	ibv_ack_cq_events(cq1, 1);
	CHECK("the completion is there", poll_n(cq1, wc, 1) == 1 && wc[0].wr_id == 1, "poll");
	poll_n(cq2, wc, 1);
	/* armed again while empty: nothing fires */
	ibv_req_notify_cq(cq1, 0);
	r = poll(&pfd, 1, 0);
	CHECK("an armed empty CQ leaves the fd quiet", r == 0, "poll %d", r);
	/* the armed CQ fires at the next completion: the event consumes the arming */
	ibv_post_recv(b, &rw, &rbad);
	ibv_post_send(a, &sw, &bad);
	poll_n(cq2, wc, 1);
	r = poll(&pfd, 1, 60000) == 1 ? ibv_get_cq_event(ch, &ev, &cqctx) : -1;
	CHECK("the next completion fires the armed CQ", r == 0 && ev == cq1, "r %d", r);
	ibv_ack_cq_events(cq1, 1);
	poll_n(cq1, wc, 1);
	/* not armed when a completion arrives, armed while it is queued: the
	 * channel reports it at once (its send completes after the receive) */
	ibv_post_recv(b, &rw, &rbad);
	ibv_post_send(a, &sw, &bad);
	poll_n(cq2, wc, 1);
	r = poll(&pfd, 1, 0);
	CHECK("an unarmed CQ's completion leaves the fd quiet", r == 0, "poll %d", r);
	CHECK("req_notify_cq on a CQ holding a completion", ibv_req_notify_cq(cq1, 0) == 0, "arm");
	r = poll(&pfd, 1, 0) == 1 ? ibv_get_cq_event(ch, &ev, &cqctx) : -1;
	CHECK("arming a CQ with completions fires at once", r == 0 && ev == cq1, "r %d", r);
	ibv_ack_cq_events(cq1, 1);
	poll_n(cq1, wc, 1);
	CHECK("destroy a channel in use is EBUSY", ibv_destroy_comp_channel(ch) == -1 && errno == EBUSY, "errno %d", errno);
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq1);
	ibv_destroy_cq(cq2);
	CHECK("destroy channel", ibv_destroy_comp_channel(ch) == 0, "errno %d", errno);
	ibv_dereg_mr(mr);
	free(buf);
}

/* UD with an AH, between two UD QPs of the context. */
static void test_ud(void)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_UD, cq, cq, NULL, 8, 1);
	struct ibv_qp *b = make_qp(IBV_QPT_UD, cq, cq, NULL, 8, 1);
	struct ibv_ah_attr aha = { .is_global = 1, .port_num = 1, .grh = { .dgid = gid0, .hop_limit = 1 } };
	struct ibv_ah *ah;
	char *buf = malloc(8192);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 8192, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_qp_attr qa;
	struct ibv_sge s, r;
	struct ibv_send_wr sw, *bad;
	struct ibv_recv_wr rw, *rbad;
	struct ibv_wc wc[2];
	int n;

	REQUIRE("ud create", cq && a && b && mr, "errno %d", errno);
	for (int i = 0; i < 2; i++) {
		struct ibv_qp *q = i ? b : a;
		CHECK("ud init", to_init(q, 1) == 0, "errno");
		memset(&qa, 0, sizeof(qa)); qa.qp_state = IBV_QPS_RTR;
		CHECK("ud rtr", ibv_modify_qp(q, &qa, IBV_QP_STATE) == 0, "rtr");
		qa.qp_state = IBV_QPS_RTS; qa.sq_psn = 0;
		CHECK("ud rts", ibv_modify_qp(q, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0, "rts");
	}
	aha.is_global = 0;
	CHECK("an AH without a GRH is EINVAL", !ibv_create_ah(pd, &aha) && errno == EINVAL, "errno %d", errno);
	aha.is_global = 1;
	ah = ibv_create_ah(pd, &aha);
	REQUIRE("create_ah", ah, "errno %d", errno);
	memset(buf, 0, 8192);
	strcpy(buf + 4096 + 40, "hello over UD");
	r = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 40 + 512, .lkey = mr->lkey };
	memset(&rw, 0, sizeof(rw)); rw.wr_id = 9; rw.sg_list = &r; rw.num_sge = 1;
	CHECK("ud post_recv", ibv_post_recv(b, &rw, &rbad) == 0, "recv");
	s = (struct ibv_sge){ .addr = (uintptr_t)(buf + 4096 + 40), .length = 14, .lkey = mr->lkey };
	memset(&sw, 0, sizeof(sw)); sw.wr_id = 10; sw.sg_list = &s; sw.num_sge = 1; sw.opcode = IBV_WR_SEND;
	sw.wr.ud.ah = ah; sw.wr.ud.remote_qpn = b->qp_num; sw.wr.ud.remote_qkey = 0x11111111;
	CHECK("ud post_send", ibv_post_send(a, &sw, &bad) == 0, "send");
	n = poll_n(cq, wc, 2);
	CHECK("ud completions", n == 2, "n %d", n);
	for (int i = 0; i < n; i++)
		if (wc[i].opcode == IBV_WC_RECV)
			CHECK("ud recv wc", wc[i].status == 0 && wc[i].byte_len == 40 + 14 && wc[i].src_qp == a->qp_num &&
			      (wc[i].wc_flags & IBV_WC_GRH) && strcmp(buf + 40, "hello over UD") == 0,
			      "status %d len %u src %u flags %#x", wc[i].status, wc[i].byte_len, wc[i].src_qp, wc[i].wc_flags);
	sw.wr.ud.ah = NULL;
	CHECK("a UD send without an AH is EINVAL", ibv_post_send(a, &sw, &bad) == EINVAL && bad == &sw, "ah");
	CHECK("destroy_ah", ibv_destroy_ah(ah) == 0, "ah");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	free(buf);
}

/* An SRQ: create with a limit, query, post, receive through it, modify. */
static void test_srq(void)
{
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1, .srq_limit = 0 } };
	struct ibv_srq *srq = ibv_create_srq(pd, &sa);
	struct ibv_cq *cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_qp *a, *b;
	char *buf = malloc(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_srq_attr q;
	struct ibv_sge s;
	struct ibv_send_wr sw, *bad;
	struct ibv_recv_wr rw[4], *rbad;
	struct ibv_wc wc[8];
	struct ibv_async_event aev;
	int n, r;

	REQUIRE("srq create", srq && cq && mr && sa.attr.max_wr >= 16, "errno %d", errno);
	CHECK("query_srq", ibv_query_srq(srq, &q) == 0 && q.max_wr >= 16 && q.srq_limit == 0, "max_wr %u", q.max_wr);
	a = make_qp(IBV_QPT_RC, cq, cq, NULL, 8, 1);
	b = make_qp(IBV_QPT_RC, cq, cq, srq, 8, 1);
	REQUIRE("srq qps", a && b && rc_connect(a, b->qp_num) == 0 && rc_connect(b, a->qp_num) == 0, "errno %d", errno);
	s = (struct ibv_sge){ .addr = (uintptr_t)buf, .length = 64, .lkey = mr->lkey };
	memset(rw, 0, sizeof(rw));
	for (int i = 0; i < 4; i++) {
		rw[i].wr_id = 40 + i; rw[i].sg_list = &s; rw[i].num_sge = 1; rw[i].next = i < 3 ? &rw[i + 1] : NULL;
	}
	CHECK("post_srq_recv", ibv_post_srq_recv(srq, rw, &rbad) == 0, "post");
	q.srq_limit = 3;
	CHECK("modify_srq limit", ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT) == 0, "modify");
	q.srq_limit = 17;
	CHECK("a limit past the SRQ's receives is EINVAL", ibv_modify_srq(srq, &q, IBV_SRQ_LIMIT) == EINVAL, "limit");
	rw[0].next = NULL; rw[0].num_sge = 2;
	r = ibv_post_srq_recv(srq, rw, &rbad);
	CHECK("post_srq_recv with too many SGEs is EINVAL at bad_wr", r == EINVAL && rbad == &rw[0], "r %d", r);
	memset(&sw, 0, sizeof(sw)); sw.wr_id = 50; sw.sg_list = &s; sw.num_sge = 1; sw.opcode = IBV_WR_SEND;
	ibv_post_send(a, &sw, &bad);
	sw.wr_id = 51;
	ibv_post_send(a, &sw, &bad);
	n = poll_n(cq, wc, 4);
	{
		int recvs = 0;
		for (int i = 0; i < n; i++)
			recvs += wc[i].opcode == IBV_WC_RECV && wc[i].status == 0 && wc[i].qp_num == b->qp_num;
		CHECK("receives through the SRQ", n == 4 && recvs == 2, "n %d recvs %d", n, recvs);
	}
	r = ibv_get_async_event(ctx, &aev);
	CHECK("the SRQ limit raises SRQ_LIMIT_REACHED", r == 0 && aev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
	      aev.element.srq == srq, "r %d type %d", r, aev.event_type);
	if (r == 0)
		ibv_ack_async_event(&aev);
	CHECK("the limit is disarmed after its event", ibv_query_srq(srq, &q) == 0 && q.srq_limit == 0, "limit %u", q.srq_limit);
	CHECK("destroy an SRQ in use is EBUSY", ibv_destroy_srq(srq) == EBUSY, "srq");
	ibv_destroy_qp(a);
	ibv_destroy_qp(b);
	CHECK("destroy_srq", ibv_destroy_srq(srq) == 0, "srq");
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	free(buf);
}

/* bench ITERS BATCH: post BATCH receives, BATCH sends (one call each) on
 * an RC pair of the context and poll the 2*BATCH completions, ITERS
 * times; prints the ns per request. */
static int bench(int iters, int batch)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 4 * batch + 4, NULL, NULL, 0);
	struct ibv_qp *a = make_qp(IBV_QPT_RC, cq, cq, NULL, batch, 1);
	struct ibv_qp *b = make_qp(IBV_QPT_RC, cq, cq, NULL, batch, 1);
	char *buf = malloc(4096);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_sge s = { .addr = (uintptr_t)buf, .length = 64, .lkey = mr ? mr->lkey : 0 };
	struct ibv_send_wr sw[256], *bad;
	struct ibv_recv_wr rw[256], *rbad;
	struct ibv_wc wc[512];
	struct timespec t0, t1;

	if (!cq || !a || !b || !mr || batch > 256 || rc_connect(a, b->qp_num) || rc_connect(b, a->qp_num)) {
		printf("bench setup failed: errno %d\n", errno);
		return 1;
	}
	memset(sw, 0, sizeof(sw));
	memset(rw, 0, sizeof(rw));
	for (int i = 0; i < batch; i++) {
		sw[i].sg_list = &s; sw[i].num_sge = 1; sw[i].opcode = IBV_WR_SEND;
		sw[i].send_flags = IBV_SEND_SIGNALED; sw[i].next = i + 1 < batch ? &sw[i + 1] : NULL;
		rw[i].sg_list = &s; rw[i].num_sge = 1; rw[i].next = i + 1 < batch ? &rw[i + 1] : NULL;
	}
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int it = 0; it < iters; it++) {
		int got = 0;
		if (ibv_post_recv(b, rw, &rbad) || ibv_post_send(a, sw, &bad)) {
			printf("bench post failed\n");
			return 1;
		}
		while (got < 2 * batch) {
			int r = ibv_poll_cq(cq, 2 * batch - got, wc);
			if (r < 0) {
				printf("bench poll failed\n");
				return 1;
			}
			got += r;
		}
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("ns/request %.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / ((double)iters * batch));
	return 0;
}

static volatile sig_atomic_t got_usr1, got_int;
static void on_usr1(int sig) { (void)sig; got_usr1++; }
static void on_int(int sig) { (void)sig; got_int++; }

/* The program's own signal handlers run with the Go runtime loaded and
 * running (its threads up): a signal sent to the process and one raised
 * in a thread. */
static void test_signals(void)
{
	struct sigaction sa;
	struct timespec t = { 0, 10 * 1000 * 1000 };

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_usr1;
	sa.sa_flags = SA_ONSTACK | SA_RESTART;
	sigaction(SIGUSR1, &sa, NULL);
	sa.sa_handler = on_int;
	sigaction(SIGINT, &sa, NULL);
	kill(getpid(), SIGUSR1);
	raise(SIGINT);
	for (int i = 0; i < 6000 && !got_usr1; i++)
		nanosleep(&t, NULL);
	CHECK("a signal sent to the process reaches the program's handler", got_usr1 == 1, "got %d", (int)got_usr1);
	CHECK("a signal raised in a thread reaches the program's handler", got_int == 1, "got %d", (int)got_int);
}

int main(int argc, char **argv)
{
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);

	REQUIRE("device list", list && num == 1 && strcmp(ibv_get_device_name(list[0]), "vfrdma0") == 0,
		"num %d", num);
	ctx = ibv_open_device(list[0]);
	REQUIRE("open_device", ctx && ctx->async_fd >= 0, "errno %d", errno);
	pd = ibv_alloc_pd(ctx);
	REQUIRE("alloc_pd", pd, "errno %d", errno);
	if (argc == 3 && strcmp(argv[1], "emptypoll") == 0) {
		/* the layer alone: ibv_poll_cq on an empty CQ; then the cgo
		 * crossing alone (the last line) */
		struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
		struct ibv_wc wc[32];
		struct timespec t0, t1;
		long n = atol(argv[2]);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (long i = 0; i < n; i++)
			if (ibv_poll_cq(cq, 32, wc) != 0)
				return 1;
		clock_gettime(CLOCK_MONOTONIC, &t1);
		printf("emptypoll ns/request %.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)n);
		/* the crossing alone: a verb whose Go side is a lookup and an add */
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (long i = 0; i < n; i++)
			ibv_ack_cq_events(cq, 0);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		printf("ns/request %.1f\n", ((t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec)) / (double)n);
		return 0;
	}
	if (argc == 4 && strcmp(argv[1], "bench") == 0) {
		ibv_query_gid(ctx, 1, 0, &gid0);
		return bench(atoi(argv[2]), atoi(argv[3]));
	}
	test_device();
	test_signals();
	test_mr();
	test_rc();
	test_inline();
	test_threads();
	test_channel();
	test_ud();
	test_srq();
	{
		/* a second context closed with everything still in it */
		struct ibv_context *c2 = ibv_open_device(list[0]);
		struct ibv_pd *p2 = c2 ? ibv_alloc_pd(c2) : NULL;
		struct ibv_cq *q2 = c2 ? ibv_create_cq(c2, 8, NULL, ibv_create_comp_channel(c2), 0) : NULL;
		struct ibv_qp_init_attr ia = { .send_cq = q2, .recv_cq = q2, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 2, .max_recv_wr = 2, .max_send_sge = 1, .max_recv_sge = 1 } };
		char *m = malloc(100);
		REQUIRE("second context", c2 && p2 && q2 && ibv_create_qp(p2, &ia) && ibv_reg_mr(p2, m, 100, 0),
			"errno %d", errno);
		CHECK("close_device with its objects alive", ibv_close_device(c2) == 0, "close");
		free(m);
	}
	CHECK("dealloc_pd", ibv_dealloc_pd(pd) == 0, "errno");
	CHECK("close_device", ibv_close_device(ctx) == 0, "close");
	ibv_free_device_list(list);
	printf("%d failures\n", failures);
	return failures;
}
