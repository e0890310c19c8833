/* pollcost: what one verb costs through whichever libibverbs the program
 * loads (the drop-in or rdma-core's with its provider), on the first
 * device: ibv_poll_cq on an empty CQ (on pvrdma an empty poll rings the
 * CQ's POLL doorbell, in both), and ibv_ack_cq_events(cq, 0) (no device
 * work in either: the call alone). Prints ns per call of each, and the
 * best of five rounds. Usage: pollcost [calls per round]. */
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double since(struct timespec *t0)
{
	struct timespec t1;

	clock_gettime(CLOCK_MONOTONIC, &t1);
	return (t1.tv_sec - t0->tv_sec) * 1e9 + (t1.tv_nsec - t0->tv_nsec);
}

int main(int argc, char **argv)
{
	long n = argc > 1 ? atol(argv[1]) : 100000;
	int num = 0;
	struct ibv_device **list = ibv_get_device_list(&num);
	struct ibv_context *ctx;
	struct ibv_cq *cq;
	struct ibv_wc wc[32];
	double poll = 0, call = 0;

	if (!list || num < 1 || n < 1) {
		fprintf(stderr, "pollcost: no device (or a bad count)\n");
		return 1;
	}
	ctx = ibv_open_device(list[0]);
	cq = ctx ? ibv_create_cq(ctx, 16, NULL, NULL, 0) : NULL;
	if (!cq) {
		fprintf(stderr, "pollcost: cannot open %s or create a CQ\n", ibv_get_device_name(list[0]));
		return 1;
	}
	for (int round = 0; round < 5; round++) {
		struct timespec t0;
		double p, c;

		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (long i = 0; i < n; i++)
			if (ibv_poll_cq(cq, 32, wc) != 0)
				return 1;
		p = since(&t0) / n;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		for (long i = 0; i < n; i++)
			ibv_ack_cq_events(cq, 0);
		c = since(&t0) / n;
		if (round == 0 || p < poll)
			poll = p;
		if (round == 0 || c < call)
			call = c;
	}
	printf("pollcost %s: empty ibv_poll_cq %.0f ns, ibv_ack_cq_events %.0f ns (best of 5 rounds of %ld)\n",
	       ibv_get_device_name(list[0]), poll, call, n);
	ibv_destroy_cq(cq);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
