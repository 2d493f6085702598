-- lockkeeper_guard, as migration 0030 installs it.
--
-- A place the plain read found is read again under the row's lock by its
-- primary key with a locking read (a unique hit locks that record alone): the
-- latest version, whatever the caller's isolation. Messages stay under
-- SIGNAL's 128 characters (0008).
CREATE PROCEDURE lockkeeper_guard(
    IN p_resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_fence BIGINT)
READS SQL DATA
SQL SECURITY DEFINER
COMMENT 'Fence check in the caller''s transaction (Lockkeeper migration 0030)'
BEGIN
    DECLARE v_found BOOLEAN DEFAULT TRUE;
    DECLARE v_owner VARCHAR(255) CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE v_fence BIGINT DEFAULT NULL;
    DECLARE v_expires_at DATETIME(6) DEFAULT NULL;
    DECLARE v_place BIGINT DEFAULT NULL;
    DECLARE v_place_expires_at DATETIME(6) DEFAULT NULL;
    DECLARE v_newest BIGINT DEFAULT NULL;
    DECLARE v_now DATETIME(6);
    DECLARE v_look BOOLEAN;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    IF @@autocommit = 1 AND @@in_transaction = 0 THEN
        SIGNAL SQLSTATE 'LK004' SET MESSAGE_TEXT =
            'lockkeeper_guard: no transaction: call it inside the transaction whose writes it guards';
    END IF;
    -- A plain read first: no lock.
    SET v_now = UTC_TIMESTAMP(6);
    SELECT owner, fence, expires_at INTO v_owner, v_fence, v_expires_at
    FROM distributed_locks WHERE resource = p_resource;
    SET v_found = TRUE;
    SELECT id, expires_at INTO v_place, v_place_expires_at
    FROM lock_holders WHERE resource = p_resource AND fence = p_fence LIMIT 1;
    SET v_found = TRUE;
    IF (v_fence = p_fence AND v_owner IS NOT NULL AND v_expires_at > v_now)
       OR v_place_expires_at > v_now THEN
        SET v_look = TRUE;
    ELSEIF @@tx_isolation IN ('READ-COMMITTED', 'READ-UNCOMMITTED') THEN
        SET v_look = FALSE;  -- the latest rows: refused as they are
    ELSE
        -- A snapshot, maybe older than the grant: refused on it only when the
        -- fence is older than the newest it knows and absent from it.
        SELECT MAX(fence) INTO v_newest FROM lock_holders
        WHERE resource = p_resource;
        SET v_newest = GREATEST(COALESCE(v_newest, 0), COALESCE(v_fence, 0));
        SET v_look = v_place IS NOT NULL
            OR (v_fence = p_fence AND v_owner IS NOT NULL) OR p_fence > v_newest;
    END IF;
    IF v_look THEN
        -- The row, shared until the caller's transaction ends, and the grants
        -- read again once it is held (locking reads: the latest rows).
        SET v_owner = NULL, v_fence = NULL, v_expires_at = NULL;
        SELECT owner, fence, expires_at INTO v_owner, v_fence, v_expires_at
        FROM distributed_locks
        WHERE resource = p_resource
        LOCK IN SHARE MODE;
        SET v_now = UTC_TIMESTAMP(6);
        SET v_place_expires_at = NULL;
        IF v_place IS NOT NULL THEN
            SELECT expires_at INTO v_place_expires_at FROM lock_holders
            WHERE id = v_place AND fence = p_fence LOCK IN SHARE MODE;
        ELSEIF NOT COALESCE(v_fence = p_fence AND v_owner IS NOT NULL, FALSE) THEN
            -- A place newer than the caller's snapshot (not READ COMMITTED).
            SELECT id, expires_at INTO v_place, v_place_expires_at
            FROM lock_holders
            WHERE resource = p_resource AND fence = p_fence
            LIMIT 1 LOCK IN SHARE MODE;
        END IF;
        SET v_found = TRUE;
        IF (v_fence = p_fence AND v_owner IS NOT NULL AND v_expires_at > v_now)
           OR v_place_expires_at > v_now THEN
            SET v_look = TRUE;
        ELSE
            SET v_look = FALSE;
        END IF;
    END IF;
    IF v_look THEN
        SET v_found = TRUE;
    ELSEIF (v_fence = p_fence AND v_owner IS NOT NULL)
           OR v_place_expires_at IS NOT NULL THEN
        SET v_message = CONCAT('lockkeeper_guard: expired: the grant of ''',
            LEFT(p_resource, 48), ''' under fence ', p_fence, ' expired');
        SIGNAL SQLSTATE 'LK002' SET MESSAGE_TEXT = v_message;
    ELSEIF EXISTS (SELECT 1 FROM lock_events
                   WHERE resource = p_resource AND fence = p_fence) THEN
        SET v_message = CONCAT('lockkeeper_guard: lost: ''', LEFT(p_resource, 48),
            ''' is no longer held under fence ', p_fence);
        SIGNAL SQLSTATE 'LK001' SET MESSAGE_TEXT = v_message;
    ELSE
        SET v_message = CONCAT('lockkeeper_guard: never held: ''',
            LEFT(p_resource, 48), ''' was never granted under fence ', p_fence);
        SIGNAL SQLSTATE 'LK003' SET MESSAGE_TEXT = v_message;
    END IF;
END
