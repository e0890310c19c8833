/*
 * softverbs beside rdma-core's provider libraries, as perftest links
 * them: libmlx5.so.1 and libefa.so.1 load against softverbs'
 * libibverbs.so.1 (their IBVERBS_PRIVATE_34 imports resolve), their
 * probes answer "not my device" for softverbs0 instead of crashing, and
 * the private interface fails the way the README says.
 *
 * Output: one line per check ("ok name" / "FAIL name: file:line: expr"),
 * then "providers: N passed, M failed". Exit status 1 on any failure.
 * Environment: SOFTVERBS_FABRIC and SOFTVERBS_NODE as for any program.
 */
#define _GNU_SOURCE
#include <infiniband/efadv.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

static int passed, failed;

#define CHECK(name, cond)                                                      \
	do {                                                                   \
		if (cond) {                                                    \
			passed++;                                              \
			printf("ok %s\n", name);                               \
		} else {                                                       \
			failed++;                                              \
			printf("FAIL %s: %s:%d: %s\n", name, __FILE__,         \
			       __LINE__, #cond);                               \
		}                                                              \
	} while (0)

/* A symbol of libibverbs at the private version node. */
static void *priv(const char *name)
{
	return dlvsym(RTLD_DEFAULT, name, "IBVERBS_PRIVATE_34");
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd = NULL;
	struct ibv_cq *cq = NULL;

	setvbuf(stdout, NULL, _IOLBF, 0);
	CHECK("device list", list && list[0]);
	if (!list || !list[0])
		goto out;

	/* mlx5: device probes */
	CHECK("mlx5dv_is_supported", !mlx5dv_is_supported(list[0]));
	{
		struct mlx5dv_context_attr a = { 0 };

		errno = 0;
		CHECK("mlx5dv_open_device",
		      !mlx5dv_open_device(list[0], &a) && errno == EOPNOTSUPP);
	}

	ctx = ibv_open_device(list[0]);
	CHECK("ibv_open_device", ctx);
	if (!ctx)
		goto out;
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	CHECK("pd and cq", pd && cq);
	if (!pd || !cq)
		goto out;

	/* context probes: each provider logs through verbs_get_ctx() first */
	{
		struct mlx5dv_context m = { 0 };
		struct efadv_device_attr e;

		CHECK("mlx5dv_query_device", mlx5dv_query_device(ctx, &m) == EOPNOTSUPP);
		CHECK("efadv_query_device",
		      efadv_query_device(ctx, &e, sizeof(e)) == EOPNOTSUPP);
	}
	{
		struct ibv_qp_init_attr_ex a = {
			.qp_type = IBV_QPT_DRIVER,
			.send_cq = cq,
			.recv_cq = cq,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1,
				 .max_send_sge = 1, .max_recv_sge = 1 },
			.comp_mask = IBV_QP_INIT_ATTR_PD,
			.pd = pd,
		};
		struct efadv_qp_init_attr e = {
			.driver_qp_type = EFADV_QP_DRIVER_TYPE_SRD,
		};

		errno = 0;
		CHECK("efadv_create_qp_ex",
		      !efadv_create_qp_ex(ctx, &a, &e, sizeof(e)) && errno == EOPNOTSUPP);
	}

	/* the extended context: inline verbs fall back or refuse */
	{
		struct ibv_device_attr_ex a;
		struct ibv_port_attr p;
		struct ibv_cq_init_attr_ex ca = { .cqe = 4 };

		memset(&a, 0xff, sizeof(a));
		CHECK("ibv_query_device_ex (legacy path)",
		      ibv_query_device_ex(ctx, NULL, &a) == 0 &&
		      a.orig_attr.max_qp == 1024 && a.comp_mask == 0);
		CHECK("ibv_query_port (legacy path)",
		      ibv_query_port(ctx, 1, &p) == 0 && p.state == IBV_PORT_ACTIVE);
		errno = 0;
		CHECK("ibv_create_cq_ex", !ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP);
	}

	/* the private interface, looked up at its version node */
	{
		void (*reg)(const void *) = priv("verbs_register_driver_34");
		int (*alloc_pd)(struct ibv_context *, struct ibv_pd *, void *, size_t,
				void *, size_t) = priv("ibv_cmd_alloc_pd");
		int (*poll)(struct ibv_cq *, int, struct ibv_wc *) = priv("ibv_cmd_poll_cq");
		void *(*init_ctx)(struct ibv_device *, int, size_t, void *, uint32_t) =
			priv("_verbs_init_and_alloc_context");
		struct ibv_context *(*open)(struct ibv_device *, void *) =
			priv("verbs_open_device");
		struct ibv_pd scratch;
		struct ibv_wc wc;
		struct ibv_context *c2;
		int dummy;

		CHECK("private symbols resolve",
		      reg && alloc_pd && poll && init_ctx && open &&
		      priv("verbs_allow_disassociate_destroy"));
		if (!reg || !alloc_pd || !poll || !init_ctx || !open)
			goto out;
		reg(&dummy); /* ignored */
		errno = 0;
		CHECK("ibv_cmd_alloc_pd",
		      alloc_pd(ctx, &scratch, NULL, 0, NULL, 0) == EOPNOTSUPP &&
		      errno == EOPNOTSUPP);
		errno = 0;
		CHECK("ibv_cmd_poll_cq", poll(cq, 1, &wc) == -1 && errno == EOPNOTSUPP);
		errno = 0;
		CHECK("_verbs_init_and_alloc_context",
		      !init_ctx(list[0], -1, 4096, NULL, 0) && errno == EOPNOTSUPP);
		errno = 0;
		CHECK("verbs_open_device with provider data",
		      !open(list[0], &dummy) && errno == EOPNOTSUPP);
		c2 = open(list[0], NULL);
		CHECK("verbs_open_device", c2);
		if (c2)
			ibv_close_device(c2);
	}
out:
	if (cq)
		ibv_destroy_cq(cq);
	if (pd)
		ibv_dealloc_pd(pd);
	if (ctx)
		ibv_close_device(ctx);
	if (list)
		ibv_free_device_list(list);
	printf("providers: %d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}
