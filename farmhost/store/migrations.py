"""Versioned schema migrations, applied in order and recorded in `PRAGMA user_version`."""

from __future__ import annotations

from typing import Final

MIGRATIONS: Final[tuple[str, ...]] = (
    # 1: the foundation
    """
    CREATE TABLE groups (
        folder TEXT PRIMARY KEY,
        jid TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        trigger TEXT,
        requires_trigger INTEGER NOT NULL DEFAULT 1,
        is_main INTEGER NOT NULL DEFAULT 0,
        added_at TEXT NOT NULL
    );
    CREATE UNIQUE INDEX groups_one_main ON groups(is_main) WHERE is_main = 1;
    CREATE TABLE chats (
        jid TEXT PRIMARY KEY,
        name TEXT,
        channel TEXT NOT NULL,
        last_activity TEXT
    );
    CREATE TABLE tasks (
        id TEXT PRIMARY KEY,
        group_folder TEXT NOT NULL,
        prompt TEXT NOT NULL,
        schedule_type TEXT NOT NULL,
        schedule_value TEXT NOT NULL,
        context_mode TEXT NOT NULL,
        status TEXT NOT NULL,
        next_run TEXT,
        last_run TEXT,
        anchor TEXT NOT NULL,
        created_at TEXT NOT NULL,
        created_by TEXT
    );
    CREATE INDEX tasks_due ON tasks(status, next_run);
    CREATE TABLE task_runs (
        id INTEGER PRIMARY KEY,
        task_id TEXT NOT NULL,
        due_at TEXT NOT NULL,
        claimed_at TEXT NOT NULL,
        finished_at TEXT,
        status TEXT NOT NULL,
        detail TEXT,
        UNIQUE (task_id, due_at)
    );
    CREATE TABLE outbox (
        id INTEGER PRIMARY KEY,
        message_key TEXT NOT NULL,
        chunk_index INTEGER NOT NULL,
        chunk_count INTEGER NOT NULL,
        chat_jid TEXT NOT NULL,
        source_folder TEXT,
        kind TEXT NOT NULL,
        body TEXT,
        file_path TEXT,
        status TEXT NOT NULL DEFAULT 'pending',
        attempts INTEGER NOT NULL DEFAULT 0,
        next_attempt_at TEXT,
        last_error TEXT,
        created_at TEXT NOT NULL,
        sent_at TEXT,
        UNIQUE (message_key, chunk_index)
    );
    CREATE INDEX outbox_pending ON outbox(status, next_attempt_at);
    CREATE TABLE request_ledger (
        folder TEXT NOT NULL,
        request_id TEXT NOT NULL,
        queue TEXT NOT NULL,
        kind TEXT NOT NULL,
        action TEXT,
        state TEXT NOT NULL,
        result TEXT,
        created_at TEXT NOT NULL,
        finished_at TEXT,
        PRIMARY KEY (folder, request_id)
    ) WITHOUT ROWID;
    CREATE INDEX request_ledger_age ON request_ledger(created_at);
    """,
    # 2: chat transcripts (every inbound and outbound message), with a full-text index
    """
    CREATE TABLE transcript (
        id INTEGER PRIMARY KEY,
        chat_jid TEXT NOT NULL,
        direction TEXT NOT NULL,
        sender TEXT,
        text TEXT NOT NULL,
        sent_at TEXT NOT NULL,
        message_key TEXT,
        UNIQUE (chat_jid, message_key)
    );
    CREATE INDEX transcript_chat ON transcript(chat_jid, sent_at);
    CREATE VIRTUAL TABLE transcript_fts USING fts5(text, content='transcript', content_rowid='id');
    CREATE TRIGGER transcript_ai AFTER INSERT ON transcript BEGIN
        INSERT INTO transcript_fts(rowid, text) VALUES (new.id, new.text);
    END;
    CREATE TRIGGER transcript_ad AFTER DELETE ON transcript BEGIN
        INSERT INTO transcript_fts(transcript_fts, rowid, text) VALUES ('delete', old.id, old.text);
    END
    """,
    # 3: Telegram: updates seen (at most once), the polling offset, what context each chat's agent got,
    # chats waiting for the operator's approval, and delivery details of outbox entries
    """
    CREATE TABLE telegram_updates (
        update_id INTEGER PRIMARY KEY,
        chat_jid TEXT,
        received_at TEXT NOT NULL,
        status TEXT NOT NULL,
        detail TEXT
    );
    CREATE TABLE host_state (
        key TEXT PRIMARY KEY,
        value TEXT NOT NULL
    );
    CREATE TABLE chat_context (
        chat_jid TEXT PRIMARY KEY,
        consumed_through INTEGER NOT NULL
    );
    CREATE TABLE pending_chats (
        jid TEXT PRIMARY KEY,
        title TEXT,
        requested_by TEXT,
        requested_at TEXT NOT NULL,
        status TEXT NOT NULL,
        folder TEXT,
        decided_at TEXT,
        decided_by TEXT
    );
    ALTER TABLE outbox ADD COLUMN options TEXT;
    ALTER TABLE outbox ADD COLUMN telegram_message_id INTEGER
    """,
    # 4: request files whose result was prepared (under result_tmp) before it was published, so a restart after a
    # kill -9 publishes a prepared result at most once (the agent may already have read and deleted it)
    """
    CREATE TABLE answered_files (
        folder TEXT NOT NULL,
        file_key TEXT NOT NULL,
        request_id TEXT NOT NULL,
        result_tmp TEXT NOT NULL,
        answered_at TEXT NOT NULL,
        PRIMARY KEY (folder, file_key)
    ) WITHOUT ROWID;
    CREATE INDEX answered_files_age ON answered_files(answered_at);
    CREATE INDEX answered_files_tmp ON answered_files(folder, result_tmp)
    """,
    # 5: the tasks that are not cancelled, which every snapshot pass and scheduler sync reads: cancelled ones pile
    # up (a group may schedule and cancel in a loop) and must not make those reads slower
    """
    CREATE INDEX tasks_live ON tasks(group_folder, next_run) WHERE status != 'cancelled'
    """,
    # 6: LLM use per group per day (the farm's date), so the proxy's daily budgets survive a restart
    """
    CREATE TABLE IF NOT EXISTS llm_usage (
        folder TEXT NOT NULL,
        day TEXT NOT NULL,
        requests INTEGER NOT NULL DEFAULT 0,
        prompt_tokens INTEGER NOT NULL DEFAULT 0,
        completion_tokens INTEGER NOT NULL DEFAULT 0,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (folder, day)
    ) WITHOUT ROWID
    """,
    # 7: the notices each chat has been given once (that its answers come from Home Assistant's Assist, ...)
    """
    CREATE TABLE chat_notices (
        chat_jid TEXT NOT NULL,
        notice TEXT NOT NULL,
        given_at TEXT NOT NULL,
        PRIMARY KEY (chat_jid, notice)
    ) WITHOUT ROWID
    """,
    # 8: actuator rules (policy.rules): each call that reached an entity under a rate limit, the control
    # actions waiting for (or decided by) an approver in the chat, bound to the exact call by its hash, and the
    # entities under maxOnSeconds that are on, with the time farmhost turns them off (claimed once)
    """
    CREATE TABLE actuator_calls (
        entity_id TEXT NOT NULL,
        called_at TEXT NOT NULL,
        group_folder TEXT NOT NULL
    );
    CREATE INDEX actuator_calls_entity ON actuator_calls(entity_id, called_at);
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        group_folder TEXT NOT NULL,
        request_id TEXT NOT NULL,
        action TEXT NOT NULL,
        params TEXT NOT NULL,
        call_hash TEXT NOT NULL,
        summary TEXT NOT NULL,
        approvers TEXT,
        status TEXT NOT NULL,
        created_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        decided_by TEXT,
        decided_at TEXT,
        outcome TEXT,
        reported INTEGER NOT NULL DEFAULT 0
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX approvals_pending_call ON approvals(group_folder, call_hash) WHERE status = 'pending';
    CREATE INDEX approvals_status ON approvals(status, expires_at);
    CREATE TABLE auto_off (
        entity_id TEXT NOT NULL,
        on_since TEXT NOT NULL,
        off_at TEXT NOT NULL,
        max_on_seconds INTEGER NOT NULL,
        status TEXT NOT NULL,
        claimed_at TEXT,
        finished_at TEXT,
        outcome TEXT,
        PRIMARY KEY (entity_id, on_since)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX auto_off_live ON auto_off(entity_id) WHERE status IN ('armed', 'claimed');
    CREATE INDEX auto_off_due ON auto_off(status, off_at)
    """,
    # 9: farm actions sent to another site over MQTT: kept until the site's answer arrives (or the deadline),
    # re-sent after a reconnect or a restart; the target site runs each id once (its ledger)
    """
    CREATE TABLE site_calls (
        id TEXT PRIMARY KEY,
        group_folder TEXT NOT NULL,
        request_id TEXT NOT NULL,
        target TEXT NOT NULL,
        message TEXT NOT NULL,
        deadline TEXT NOT NULL,
        status TEXT NOT NULL,
        sends INTEGER NOT NULL DEFAULT 0,
        created_at TEXT NOT NULL,
        answered_at TEXT,
        result TEXT
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX site_calls_request ON site_calls(group_folder, request_id);
    CREATE INDEX site_calls_pending ON site_calls(status, target)
    """,
    # 10: a chat's messages by id, so memory_search fetches only the messages after the last one it indexed and
    # a chat's latest window walks the index backwards (transcript_chat orders by sent_at: a scan of the chat)
    """
    CREATE INDEX transcript_chat_id ON transcript(chat_jid, id)
    """,
    # 11: the host uid (= gid) each group's agent runs get under a root daemon (farmhost/agents/sandbox/identity.py);
    # a row is never deleted, so an id is never given to another group while the old group's files may exist
    """
    CREATE TABLE agent_ids (
        folder TEXT PRIMARY KEY,
        uid INTEGER NOT NULL UNIQUE,
        allocated_at TEXT NOT NULL
    ) WITHOUT ROWID
    """,
    # 12: the edge state of each `when` task (scheduler/watcher.py): whether its condition is true and since when,
    # whether this true period fired, the last fire (cooldown) and the event handed to the run it claimed
    """
    CREATE TABLE when_state (
        task_id TEXT PRIMARY KEY,
        true_since TEXT,
        fired INTEGER NOT NULL DEFAULT 0,
        last_fired TEXT,
        event_due TEXT,
        event TEXT,
        updated_at TEXT NOT NULL
    ) WITHOUT ROWID
    """,
    # 13: farm alerts told to chats (farmhost/farm/state/alert_notifier.py): one row per alert occurrence and chat, so an
    # alert is told once across restarts, its repeats and its resolution line are timed, and who acknowledged it
    # is kept. `subject` is what makes two alerts the same (rule and entity; a violation's own id): at most one
    # row of a subject and chat is not `closed`, and an alert that returns within the flap window reopens it.
    """
    CREATE TABLE alert_notices (
        id INTEGER PRIMARY KEY,
        subject TEXT NOT NULL,
        chat_jid TEXT NOT NULL,
        alert_id TEXT NOT NULL,
        rule TEXT NOT NULL,
        entity_id TEXT NOT NULL,
        severity TEXT NOT NULL,
        text TEXT NOT NULL,
        since TEXT NOT NULL,
        status TEXT NOT NULL,
        due_at TEXT,
        sends INTEGER NOT NULL DEFAULT 0,
        acked_by TEXT,
        acked_at TEXT,
        resolved_at TEXT,
        created_at TEXT NOT NULL
    );
    CREATE UNIQUE INDEX alert_notices_open ON alert_notices(subject, chat_jid) WHERE status != 'closed';
    CREATE INDEX alert_notices_due ON alert_notices(status, due_at)
    """,
    # 14: the file a request was answered from, in its own ledger row (farmhost/store/ledger.py `mark_answering`):
    # a read's one transaction writes one row and its age index instead of also a row of `answered_files` and its
    # two indexes (about a third of the pages of the commit). `answered_files` keeps the other files of an id (a
    # re-sent request) and the rows written before this migration.
    """
    ALTER TABLE request_ledger ADD COLUMN file_key TEXT;
    ALTER TABLE request_ledger ADD COLUMN result_tmp TEXT
    """,
    # 15: Telegram updates whose handling waits for an earlier one of their chat (a voice note being heard,
    # farmhost/telegram/inbound/chat_queues.py): the raw update, confirmed to Telegram when deferred, read back into
    # the chats' queues at start and deleted once handled, so a kill -9 loses none and a restart handles none twice.
    """
    CREATE TABLE telegram_deferred (
        update_id INTEGER PRIMARY KEY,
        chat_jid TEXT NOT NULL,
        raw TEXT NOT NULL,
        deferred_at TEXT NOT NULL
    )
    """,
)
