/* coordinator-status.c: whether this daemon's coordinator (etcd) answers, for GetStatus and health. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "coordinator-status.h"

static pthread_mutex_t status_lock = PTHREAD_MUTEX_INITIALIZER;
static CoordinatorStatus status;
/* Its own lock, held while the hook runs: never taken inside status_lock, nor the other way. */
static pthread_mutex_t hook_lock = PTHREAD_MUTEX_INITIALIZER;
static void (*hook)(void *userdata);
static void *hook_userdata;

void coordinator_status_configure(const char *endpoints, const char *cluster) {
        (void) pthread_mutex_lock(&status_lock);
        status = (CoordinatorStatus) { .configured = true, .reachable = true };
        (void) snprintf(status.endpoints, sizeof status.endpoints, "%s", endpoints ? endpoints : "");
        (void) snprintf(status.cluster, sizeof status.cluster, "%s", cluster ? cluster : "");
        (void) pthread_mutex_unlock(&status_lock);
}

void coordinator_status_set_reachable(bool reachable, const char *why) {
        bool changed;

        (void) pthread_mutex_lock(&status_lock);
        changed = status.reachable != reachable;
        status.reachable = reachable;
        if (why)
                (void) snprintf(status.last_error, sizeof status.last_error, "%s", why);
        (void) pthread_mutex_unlock(&status_lock);
        if (!changed)
                return;
        (void) pthread_mutex_lock(&hook_lock);
        if (hook)
                hook(hook_userdata);
        (void) pthread_mutex_unlock(&hook_lock);
}

void coordinator_status_on_change(void (*changed)(void *userdata), void *userdata) {
        (void) pthread_mutex_lock(&hook_lock);
        hook = changed;
        hook_userdata = userdata;
        (void) pthread_mutex_unlock(&hook_lock);
}

void coordinator_status_clear(void) {
        (void) pthread_mutex_lock(&status_lock);
        status = (CoordinatorStatus) {};
        (void) pthread_mutex_unlock(&status_lock);
}

void coordinator_status_get(CoordinatorStatus *ret) {
        (void) pthread_mutex_lock(&status_lock);
        *ret = status;
        (void) pthread_mutex_unlock(&status_lock);
}
