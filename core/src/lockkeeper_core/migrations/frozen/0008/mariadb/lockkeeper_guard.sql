-- lockkeeper_guard, as migration 0008 installs it.
--
-- InnoDB: ``LOCK IN SHARE MODE`` on the unique index of ``resource`` takes a
-- shared record lock held to the end of the transaction; the locking read sees
-- the latest committed row whatever the isolation level. UTC_TIMESTAMP is read
-- per statement inside a procedure, so ``v_now`` is read after the lock is held.
-- The parameter carries the column's collation (binary, no pad): compared with
-- another, the lookup would fail or match ``Job:1`` for ``job:1``. Messages stay
-- under SIGNAL's 128 characters: the resource is cut to 48 of them.
CREATE PROCEDURE lockkeeper_guard(
    IN p_resource VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin,
    IN p_fence BIGINT)
READS SQL DATA
SQL SECURITY DEFINER
COMMENT 'Fence check in the caller''s transaction (Lockkeeper migration 0008)'
BEGIN
    DECLARE v_found BOOLEAN DEFAULT TRUE;
    DECLARE v_owner VARCHAR(255) CHARACTER SET utf8mb4 DEFAULT NULL;
    DECLARE v_fence BIGINT DEFAULT NULL;
    DECLARE v_expires_at DATETIME(6) DEFAULT NULL;
    DECLARE v_now DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_found = FALSE;
    IF @@autocommit = 1 AND @@in_transaction = 0 THEN
        SIGNAL SQLSTATE 'LK004' SET MESSAGE_TEXT =
            'lockkeeper_guard: no transaction: call it inside the transaction whose writes it guards';
    END IF;
    SELECT owner, fence, expires_at INTO v_owner, v_fence, v_expires_at
    FROM distributed_locks
    WHERE resource = p_resource
    LOCK IN SHARE MODE;
    SET v_now = UTC_TIMESTAMP(6);
    IF v_found AND v_fence = p_fence AND v_owner IS NOT NULL THEN
        IF v_expires_at > v_now THEN
            SET v_found = TRUE;
        ELSE
            SET v_message = CONCAT('lockkeeper_guard: expired: the grant of ''',
                LEFT(p_resource, 48), ''' under fence ', p_fence, ' expired');
            SIGNAL SQLSTATE 'LK002' SET MESSAGE_TEXT = v_message;
        END IF;
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
