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
// Submit with a pushed release: when the chunk is released, its ticket (8
// bytes, host byte order) is written to fd (a pipe or socket the caller
// reads; a full one loses the notice, so size it for the chunks in flight).
// For callers that block until a release instead of polling.  Returns the
// ticket, or 0 if bytes < 0 or fd < 0.
uint64_t hvdprio_submit_notify(hvdprio_scheduler* h, const char* name, int64_t priority,
                               int64_t bytes, int fd);
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

// ---- Native arbiter client (arbiter_client.h): the job side of the link
// arbiter's protocol 2, HMAC-SHA256 included, with its own I/O thread.
typedef struct hvdprio_arbiter hvdprio_arbiter;
typedef void (*hvdprio_grant_cb)(uint64_t key);
typedef void (*hvdprio_log_cb)(int level, const char* msg);  // Python logging levels
typedef int64_t (*hvdprio_steps_cb)(void);

// Comma-separated names of the values hvdprio_arbiter_counters() writes.
const char* hvdprio_arbiter_counter_fields(void);
// Connects in the background and returns at once.  timing: timeout, max_wait,
// idle_heartbeat, handshake_timeout (< 0: max(1, 4 * timeout)),
// backoff_initial, backoff_max (seconds).  With sched, every grant releases
// that scheduler's chunk (hvdprio_arbiter_attach hooks the client into it);
// without, grant(key) is called (from the I/O thread).  log may be NULL
// (warnings go to stderr).  NULL on a bad argument.
hvdprio_arbiter* hvdprio_arbiter_new(const char* host, int port, const char* link,
                                     const char* job_id, const char* secret,
                                     int64_t secret_len, int32_t job_class,
                                     const double* timing, int n_timing,
                                     hvdprio_scheduler* sched, hvdprio_grant_cb grant,
                                     hvdprio_log_cb log, int io_policy, int io_value);
// 0 sent/queued; 1 closed; 2 key already pending or granted; 3 label > 256 bytes.
int hvdprio_arbiter_request(hvdprio_arbiter* a, uint64_t key, int64_t priority,
                            uint64_t nbytes, const char* label, int64_t label_len,
                            uint64_t step);
int hvdprio_arbiter_complete(hvdprio_arbiter* a, uint64_t key);
int hvdprio_arbiter_cancel(hvdprio_arbiter* a, uint64_t key);
// External-grant hooks of the scheduler given to hvdprio_arbiter_new point at
// this client (no other callbacks then).  0, or -1 without a scheduler.
int hvdprio_arbiter_attach(hvdprio_arbiter* a);
// Step tag of the requests the scheduler makes (NULL: untagged).
void hvdprio_arbiter_set_steps(hvdprio_arbiter* a, hvdprio_steps_cb steps);
// 0 connecting, 1 handshake, 2 ready, 3 backoff, 4 closed.
int hvdprio_arbiter_state(hvdprio_arbiter* a);
int hvdprio_arbiter_counters(hvdprio_arbiter* a, double* out, int n);
// Stops the I/O thread, waiting at most timeout seconds (idempotent).
void hvdprio_arbiter_close(hvdprio_arbiter* a, double timeout);
// Closes (5 s) and drops the handle.
void hvdprio_arbiter_free(hvdprio_arbiter* a);
// HMAC-SHA256 as the client computes it (out: 32 bytes).
void hvdprio_hmac_sha256(const char* key, int64_t key_len, const char* msg, int64_t msg_len,
                         unsigned char* out);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // HOROVOD_PRIO_SCHEDULER_C_API_H_
