-- lockkeeper_token_clock, as migration 0039 installs it.
--
-- A new exclusive tenure under an API token, in the round trip after the
-- resource's row is locked (the lock order: the resource's row, then the
-- token's). Each step is a statement of its own, so each starts once the one
-- before it has returned (a clock or a count read after the token's row lock
-- is read after it, as when they were round trips of their own):
--
-- 1. Under a quota (p_max_locks), a first look that only picks how the
--    token's row is locked: far from the quota (its live grants plus the
--    server's max_connections, the most grants that can be in flight at once,
--    below p_max_locks) the row is locked shared and the count after the lock
--    is held to p_max_locks - max_connections; nearer, the row is locked for
--    update (one new grant of the token at a time) and held to p_max_locks.
--    With no quota, shared: only a revocation waits for it.
-- 2. The token's row, locked.
-- 3. The clock, whether a freeze covers p_resource by it, the token's live
--    grants (exclusive grants and places) and, with p_fence, a new fence,
--    drawn only for a grant none of these refuses.
--
-- A count is of index entries, (token, expires_at) in each table, so it costs
-- what the token holds, which its quota bounds. Each kind counted through a
-- derived table with LIMIT (the statements' bound) cost a temporary table per
-- kind and count, about 200 us of the server's time per grant in all.
--
-- One row back: found (the token has a row), revoked_at, expires_at, now,
-- frozen, over_quota (the limit is reached), far (the row was locked shared
-- under a quota: over_quota then means "no longer far", and the caller tries
-- again), fence. The caller decides and writes.
CREATE PROCEDURE lockkeeper_token_clock(
    IN p_token VARCHAR(80) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_max_locks INT,
    IN p_fence BOOLEAN)
MODIFIES SQL DATA
SQL SECURITY INVOKER
COMMENT 'A new grant''s token row, clock, freeze, quota and fence (Lockkeeper migration 0039)'
BEGIN
    DECLARE v_margin INT DEFAULT @@max_connections;
    DECLARE v_limit INT DEFAULT p_max_locks;
    DECLARE v_far BOOLEAN DEFAULT FALSE;
    DECLARE v_found INT;
    DECLARE v_revoked_at DATETIME(6);
    DECLARE v_expires_at DATETIME(6);
    DECLARE v_now DATETIME(6);
    DECLARE v_frozen BOOLEAN;
    DECLARE v_live INT DEFAULT 0;
    DECLARE v_over BOOLEAN DEFAULT FALSE;
    DECLARE v_fence BIGINT DEFAULT NULL;
    IF p_max_locks > v_margin THEN
        SET v_now = UTC_TIMESTAMP(6), v_limit = p_max_locks - v_margin;
        SELECT
            (SELECT COUNT(*) FROM distributed_locks
                WHERE token = p_token AND expires_at > v_now)
          + (SELECT COUNT(*) FROM lock_holders
                WHERE token = p_token AND expires_at > v_now)
            INTO v_live;
        SET v_far = v_live < v_limit;
        IF NOT v_far THEN
            SET v_limit = p_max_locks;
        END IF;
    END IF;
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
        v_over AS over_quota, v_far AS far, v_fence AS fence;
END
