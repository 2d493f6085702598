-- lockkeeper_token_grant, as migration 0044 installs it.
--
-- A new exclusive tenure under an API token, in the round trip after the
-- resource's row is locked (the lock order: the resource's row, then the
-- token's). It takes the place of lockkeeper_token_clock (migration 0039,
-- kept for older code), less that procedure's first look: a count of the
-- token's live grants before its row lock, only to pick how the row is
-- locked. That choice is the caller's now (p_shared), from what the last
-- grant of the token in its process found (near). Every count of a token's
-- live grants walks its index entries that grants and releases moved and
-- purge has not removed yet, each checked against its row: with one token's
-- grants churning, a count of 6 live grants read 477 pages and 129 old row
-- versions, and the first look made that twice per grant.
--
-- Each step is a statement of its own, so each starts once the one before it
-- has returned (the clock and the count are read after the token's row lock):
--
-- 1. The token's row, locked: shared with no quota (only a revocation waits
--    for it) and, with p_shared, under a quota above the server's
--    max_connections (the most grants that can be in flight at once); the
--    count after the lock is then held to p_max_locks - max_connections, so
--    no set of grants in flight at once takes the token past its quota.
--    Otherwise for update: one new grant of the token at a time, each
--    counting every one before it, held to p_max_locks.
-- 2. The clock, whether a freeze covers p_resource by it, the token's live
--    grants (exclusive grants and places) and, with p_fence, a new fence,
--    drawn only for a grant none of these refuses.
--
-- One row back: found (the token has a row), revoked_at, expires_at, now,
-- frozen, over_quota (the limit is reached), far (the row was locked shared
-- under a quota: over_quota then means "no longer far", and the caller tries
-- again, asking for the row alone), near (under a quota above
-- max_connections, this grant's count leaves the token within
-- max_connections of it: the next grant should ask for the row alone), fence.
-- The caller decides and writes.
CREATE PROCEDURE lockkeeper_token_grant(
    IN p_token VARCHAR(80) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_max_locks INT,
    IN p_shared BOOLEAN,
    IN p_fence BOOLEAN)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'A new grant''s token row, clock, freeze, quota and fence (Lockkeeper migration 0044)'
BEGIN
    DECLARE v_margin INT DEFAULT @@max_connections;
    DECLARE v_far BOOLEAN DEFAULT COALESCE(p_max_locks > v_margin AND p_shared, FALSE);
    DECLARE v_limit INT DEFAULT IF(v_far, p_max_locks - v_margin, p_max_locks);
    DECLARE v_found INT;
    DECLARE v_revoked_at DATETIME(6);
    DECLARE v_expires_at DATETIME(6);
    DECLARE v_now DATETIME(6);
    DECLARE v_frozen BOOLEAN;
    DECLARE v_live INT DEFAULT 0;
    DECLARE v_over BOOLEAN DEFAULT FALSE;
    DECLARE v_fence BIGINT DEFAULT NULL;
    -- An aggregate, so that a token with no row reads as not found (no
    -- NOT FOUND condition).
    IF p_max_locks IS NOT NULL AND NOT v_far THEN
        SELECT COUNT(*), MAX(revoked_at), MAX(expires_at)
            INTO v_found, v_revoked_at, v_expires_at
            FROM api_tokens WHERE name = p_token FOR UPDATE;
    ELSE
        SELECT COUNT(*), MAX(revoked_at), MAX(expires_at)
            INTO v_found, v_revoked_at, v_expires_at
            FROM api_tokens WHERE name = p_token LOCK IN SHARE MODE;
    END IF;
    -- Read after the lock: UTC_TIMESTAMP is fixed when a statement starts.
    SET v_now = UTC_TIMESTAMP(6);
    SET v_frozen = EXISTS (
        SELECT 1 FROM lock_freezes
        WHERE prefix = SUBSTR(p_resource, 1, LENGTH(prefix))
          AND (ends_at IS NULL OR ends_at > v_now));
    IF p_max_locks IS NOT NULL THEN
        SELECT
            (SELECT COUNT(*) FROM distributed_locks
                WHERE token = p_token AND expires_at > v_now)
          + (SELECT COUNT(*) FROM lock_holders
                WHERE token = p_token AND expires_at > v_now)
            INTO v_live;
        SET v_over = v_live >= v_limit;
    END IF;
    IF p_fence AND NOT v_frozen AND NOT v_over AND v_revoked_at IS NULL
            AND (v_expires_at IS NULL OR v_expires_at > v_now) THEN
        SET v_fence = NEXTVAL(lock_fence_seq);
    END IF;
    SELECT v_found > 0 AS found, v_revoked_at AS revoked_at,
        v_expires_at AS expires_at, v_now AS now, v_frozen AS frozen,
        v_over AS over_quota, v_far AS far,
        p_max_locks > v_margin AND v_live + 1 >= p_max_locks - v_margin AS near,
        v_fence AS fence;
END
