// C API of the horovod_prio release scheduler (libhvdprio_scheduler.so).
//
// A caller may own several scheduler instances (hvdprio_new / hvdprio_free,
// e.g. the simulator: one per simulated job) or use the process-wide one
// (hvdprio_global) that the TensorFlow kernels use.  Every function takes the
// handle first.  Used from Python through ctypes by horovod_prio/scheduler.
#ifndef HOROVOD_PRIO_SCHEDULER_C_API_H_
#define HOROVOD_PRIO_SCHEDULER_C_API_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct hvdprio_scheduler hvdprio_scheduler;

// request(ticket, name, priority, bytes); complete/cancel(ticket).
typedef void (*hvdprio_request_cb)(uint64_t ticket, const char* name,
                                   int64_t priority, int64_t bytes);
typedef void (*hvdprio_ticket_cb)(uint64_t ticket);

// Version of this API (bumped on any change of a signature or of the stats).
int hvdprio_api_version(void);

hvdprio_scheduler* hvdprio_global(void);
hvdprio_scheduler* hvdprio_new(void);
void hvdprio_free(hvdprio_scheduler* h);  // no-op on the global one

// Returns 0, or -1 if credit < 0 (nothing changed).  credit = INT64_MAX: no
// byte limit.
int hvdprio_configure(hvdprio_scheduler* h, int64_t credit_bytes, int hold);
void hvdprio_set_tracing(hvdprio_scheduler* h, int on);
void hvdprio_set_max_events(hvdprio_scheduler* h, int64_t max_events);

// Polling interface (chunks submitted here have no release callback).
// submit returns the ticket (> 0), or 0 if bytes < 0.
uint64_t hvdprio_submit(hvdprio_scheduler* h, const char* name, int64_t priority,
                        int64_t bytes);
// Moves up to n released tickets into out (oldest first); returns how many.
// Call again while it returns n.
int64_t hvdprio_take_released(hvdprio_scheduler* h, uint64_t* out, int64_t n);
// Requests (external grant mode, no request callback): up to n, oldest first.
int64_t hvdprio_take_requests(hvdprio_scheduler* h, uint64_t* tickets,
                              int64_t* priorities, int64_t* bytes, int64_t n);

// 1 if the chunk completed, 0 if none such was in flight.
int hvdprio_complete(hvdprio_scheduler* h, const char* name);
int hvdprio_complete_ticket(hvdprio_scheduler* h, uint64_t ticket);
// 0 unknown/finished, 1 waiting chunk withdrawn, 2 requested chunk withdrawn,
// 3 in-flight chunk abandoned.
int hvdprio_cancel(hvdprio_scheduler* h, uint64_t ticket);
int64_t hvdprio_abandon_inflight(hvdprio_scheduler* h);

void hvdprio_set_external_grant(hvdprio_scheduler* h, int on);
// Any callback may be NULL.  Called outside the scheduler's lock, from the
// thread whose call generated them; they must not block.
void hvdprio_set_grant_callbacks(hvdprio_scheduler* h, hvdprio_request_cb request,
                                 hvdprio_ticket_cb complete, hvdprio_ticket_cb cancel);
// 1 if that requested chunk was released, 0 otherwise.
int hvdprio_grant(hvdprio_scheduler* h, uint64_t ticket);

// Moves the recorded events into a pending JSON-lines text (one object per
// line: kind, name, ticket, priority, bytes, t_us, queued, inflight_bytes
// and, for "request"/"release", waiting and waiting_max_priority).  If buf
// is not NULL and cap is at least the text length + 1, copies the text with a
// terminating NUL, clears it and returns its length; otherwise returns
// -(length + 1) and keeps the text for the next call.
int64_t hvdprio_drain_events(hvdprio_scheduler* h, char* buf, int64_t cap);

// Comma-separated names of the values hvdprio_stats() writes, in order.
const char* hvdprio_stats_fields(void);
// Writes min(n, N) values into out; returns N.
int hvdprio_stats(hvdprio_scheduler* h, int64_t* out, int n);

// 1 on success, 0 if refused because chunks are waiting or requested.
int hvdprio_reset(hvdprio_scheduler* h);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // HOROVOD_PRIO_SCHEDULER_C_API_H_
