// Package bridge holds the semantics of the libibverbs drop-in (package
// ibverbs, a cgo c-shared library) in plain Go, so that they are tested
// without cgo on the device model: which devices the library lists
// (Devices), opening one (Open), the attributes the verbs queries report
// (DeviceAttr, PortAttr, GIDs), ibv_modify_qp's attribute masks and
// states mapped onto the driver's QP transitions (QP.Modify), the
// translation of work requests and completions with per-object scratch
// (QP.PostSend, CQ.Poll: nothing allocated per call), completion channels
// over the CQs' own file descriptors (Channel), async events queued behind
// an eventfd (Context.AsyncFD, Context.NextAsyncEvent), and errors as the
// errno values rdma-core's providers return (Errno).
//
// The cgo layer owns the C structures and keeps, in each, the id of the
// bridge object behind it; the bridge keeps the C structure's address
// (User) where it has to hand an object back (async events, completion
// channels).
package bridge
