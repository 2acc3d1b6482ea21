/* journal.h: the log's journal sink (sd_journal_sendv with PRIORITY, MESSAGE, CODE_* and fields). */
#pragma once

#include "common/log.h"

/* Sends the daemon's log lines to the journal when the log's target is the journal. */
void journal_log_install(void);
