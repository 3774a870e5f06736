SELECT alk_floor.enq_v3('bench', '{"to": "user@example.com", "n": 1}'::jsonb);
